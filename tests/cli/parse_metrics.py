#!/usr/bin/python3
"""Parses a Prometheus text exposition (the file named by argv[1]) with the
prometheus_client parser and prints one JSON object per sample:
{"family": ..., "type": ..., "name": ..., "labels": {...}, "value": ...}.
Exit 3 when prometheus_client is missing, 1 when the text does not parse."""
import json
import math
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:  # the test decides whether this is a skip or a failure
    print("prometheus_client is not installed: %s" % e, file=sys.stderr)
    sys.exit(3)

with open(sys.argv[1], encoding="utf-8") as f:
    text = f.read()
try:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            value = s.value
            if isinstance(value, float) and math.isinf(value):
                value = str(value)
            print(json.dumps({"family": family.name, "type": family.type, "name": s.name,
                              "labels": s.labels, "value": value}, sort_keys=True))
except Exception as e:  # noqa: BLE001 - any parse error fails the test with its text
    print("parse error: %r" % (e,), file=sys.stderr)
    sys.exit(1)
