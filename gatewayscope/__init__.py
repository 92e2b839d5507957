"""gatewayscope: observability and remediation for the rLLM trace store and Bifrost provider records."""

__version__ = "0.1.0"
