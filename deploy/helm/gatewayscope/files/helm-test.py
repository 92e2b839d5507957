"""The chart's `helm test`: the exporter answers /-/ready, and its /metrics has a gatewayscope_up series for
every configured target (up or down: the test checks the exporter, not the gateways).

Run by the chart's own image with its Python (the image has no shell), from these variables:
GATEWAYSCOPE_URL (the Service), GATEWAYSCOPE_TARGETS (a JSON list of target names), with basic auth
GATEWAYSCOPE_USERNAME_FILE and GATEWAYSCOPE_PASSWORD_FILE, with TLS GATEWAYSCOPE_TLS_INSECURE=1 (the
Service's name need not be in the certificate). Exits 0 when all holds, else 1 with one line saying what failed.
"""

import base64
import json
import os
import re
import ssl
import sys
import urllib.error
import urllib.request

TIMEOUT_SECONDS = 30


def fetch(url: str, headers: dict, context: ssl.SSLContext) -> str:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS, context=context) as response:
        return response.read(64 * 1024 * 1024).decode("utf-8", "replace")


def main() -> int:
    base = os.environ["GATEWAYSCOPE_URL"].rstrip("/")
    targets = json.loads(os.environ.get("GATEWAYSCOPE_TARGETS", "[]"))
    context = ssl.create_default_context()
    if os.environ.get("GATEWAYSCOPE_TLS_INSECURE") == "1":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    headers = {"X-Prometheus-Scrape-Timeout-Seconds": str(TIMEOUT_SECONDS - 5)}
    if os.environ.get("GATEWAYSCOPE_PASSWORD_FILE"):
        with open(os.environ["GATEWAYSCOPE_USERNAME_FILE"], encoding="utf-8") as handle:
            user = handle.read().rstrip("\r\n")
        with open(os.environ["GATEWAYSCOPE_PASSWORD_FILE"], encoding="utf-8") as handle:
            password = handle.read().rstrip("\r\n")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    try:
        ready = fetch(f"{base}/-/ready", {}, context)
        metrics = fetch(f"{base}/metrics", headers, context)
    except (urllib.error.URLError, OSError) as err:
        print(f"helm test: the exporter at {base} did not answer: {err}", file=sys.stderr)
        return 1
    if ready.strip() != "OK":
        print(f"helm test: {base}/-/ready answered {ready[:100]!r}, not OK", file=sys.stderr)
        return 1
    missing = [name for name in targets
               if not re.search(r'^gatewayscope_up\{[^}]*target="' + re.escape(name) + '"', metrics, re.MULTILINE)]
    if missing:
        print(f"helm test: {base}/metrics has no gatewayscope_up for {', '.join(missing)}", file=sys.stderr)
        return 1
    print(f"helm test: {base} is ready and serves {len(targets)} target(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
