"""Schemathesis hooks for .ci/schemathesis: sends NDJSON ingest bodies.

docs/openapi.yaml describes an `application/x-ndjson` body as the array of envelopes it frames;
schemathesis has no serializer for that media type, so without this it never sends one.
"""

import json

import schemathesis


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx, value):
    items = value if isinstance(value, list) else [value]
    # One JSON text per line, as `airlock publish` writes them; a generated non-object element
    # becomes a line the server must refuse on its own (an item error, never a 5xx).
    return "".join(json.dumps(item) + "\n" for item in items).encode("utf-8")
