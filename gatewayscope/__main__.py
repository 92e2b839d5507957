"""``python -m gatewayscope``: the same as the ``gatewayscope`` command."""

from gatewayscope.cli import run

if __name__ == "__main__":
    run()
