"""An emulator of the Bifrost management API (not the real gateway).

The real Bifrost (Go) cannot run on the project's machines, so this real HTTP server stands in for it in
every test and in the demo. It reproduces the gateway's management API case by case, as docs/sandbox.md
("The emulated management API") describes it: status codes and exact messages, PUT as an upsert with the
omitted-block table, secret masking, the base-URL DNS refusal, parked-worker accounting, the process's
``/metrics`` and its memory limit, plus faults on demand and a request log under the emulator-only
``/_emulator/*`` namespace.

>>> from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator, seed_realistic
>>> with BifrostEmulator() as emu:                       # doctest: +SKIP
...     summary = seed_realistic(emu)
...     emu.url, summary.parked_workers
"""

from gatewayscope.sandbox.bifrost_emulator.api import Reply, error_envelope
from gatewayscope.sandbox.bifrost_emulator.globalconfig import DEFAULT_CLIENT_CONFIG, AuthConfig, GlobalConfig
from gatewayscope.sandbox.bifrost_emulator.model import (
    DEFAULT_BUFFER_SIZE,
    DEFAULT_CONCURRENCY,
    STANDARD_PROVIDERS,
    SUPPORTED_BASE_PROVIDERS,
    Concurrency,
    CustomProviderConfig,
    Key,
    NetworkConfig,
    ProviderRecord,
    ProxyConfig,
    Secret,
    default_network_config,
    looks_masked,
    redact,
)
from gatewayscope.sandbox.bifrost_emulator.seed import (
    DEFAULT_LIVE_PORT,
    DEFAULT_RNG_SEED,
    SEED_NAMES,
    SeedSummary,
    apply_seed,
    build_seed,
    realistic_records,
    seed_realistic,
    seed_small,
    small_records,
)
from gatewayscope.sandbox.bifrost_emulator.server import BifrostEmulator, EmulatorOptions
from gatewayscope.sandbox.bifrost_emulator.state import (
    ANY,
    CONFIG,
    DEFAULT_BASELINE_GOROUTINES,
    DEFAULT_BASELINE_MEMORY_BYTES,
    DEFAULT_STACK_BYTES_PER_GOROUTINE,
    LIST,
    METRICS,
    STACK_BYTES_HIGH,
    STACK_BYTES_LOW,
    Fault,
    LoggedRequest,
    ProcessModel,
)

__all__ = [
    "ANY",
    "CONFIG",
    "DEFAULT_BASELINE_GOROUTINES",
    "DEFAULT_BASELINE_MEMORY_BYTES",
    "DEFAULT_BUFFER_SIZE",
    "DEFAULT_CLIENT_CONFIG",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_LIVE_PORT",
    "DEFAULT_RNG_SEED",
    "DEFAULT_STACK_BYTES_PER_GOROUTINE",
    "LIST",
    "METRICS",
    "SEED_NAMES",
    "STACK_BYTES_HIGH",
    "STACK_BYTES_LOW",
    "STANDARD_PROVIDERS",
    "SUPPORTED_BASE_PROVIDERS",
    "AuthConfig",
    "BifrostEmulator",
    "Concurrency",
    "CustomProviderConfig",
    "EmulatorOptions",
    "Fault",
    "GlobalConfig",
    "Key",
    "LoggedRequest",
    "NetworkConfig",
    "ProcessModel",
    "ProviderRecord",
    "ProxyConfig",
    "Reply",
    "Secret",
    "SeedSummary",
    "apply_seed",
    "build_seed",
    "default_network_config",
    "error_envelope",
    "looks_masked",
    "realistic_records",
    "redact",
    "seed_realistic",
    "seed_small",
    "small_records",
]
