#!/usr/bin/env python3
"""Container health check: exit 0 when a URL answers 2xx within 5 s, else 1.

    rollout-healthcheck [URL]        # default: $HEALTHCHECK_URL

Standard library only (the slim image has no curl). Used by the Dockerfile's HEALTHCHECK
and by docker-compose.yml; Kubernetes probes the same paths with httpGet instead.
"""

from __future__ import annotations

import os
import sys
import urllib.request


def main(argv: list[str]) -> int:
    url = argv[1] if len(argv) > 1 else os.environ.get("HEALTHCHECK_URL", "")
    if not url:
        print("no URL to probe (pass one or set HEALTHCHECK_URL)", file=sys.stderr)
        return 1
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return 0 if 200 <= resp.status < 300 else 1
    except Exception as e:  # any failure to answer is "unhealthy"; say why in `docker inspect`
        print(f"{url}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
