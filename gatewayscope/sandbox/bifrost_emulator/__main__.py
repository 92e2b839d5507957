"""``python -m gatewayscope.sandbox.bifrost_emulator --port P --seed realistic``."""

from gatewayscope.sandbox.bifrost_emulator.cli import main

raise SystemExit(main())
