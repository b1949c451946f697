"""Schemathesis hooks for .ci/schemathesis: sends NDJSON ingest bodies and reads JSONL exports.

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


@schemathesis.deserializer("application/x-ndjson")
def ndjson_lines(ctx, response):
    # `GET /api/v1/export` answers JSONL; docs/openapi.yaml describes it as the array of its
    # lines (a header object, then the events), so each line is checked against the schema.
    text = response.content.decode("utf-8")
    if text and not text.endswith("\n"):
        raise ValueError("JSONL body does not end with a newline (a truncated export?)")
    lines = [json.loads(line) for line in text.splitlines()]
    # The schema allows either shape per line; the order is checked here.
    is_header = [isinstance(line, dict) and "export" in line for line in lines]
    if not is_header or not is_header[0] or any(is_header[1:]):
        raise ValueError("an export must have its header line first, and only there")
    is_end = [isinstance(line, dict) and "end" in line for line in lines]
    if not is_end[-1] or any(is_end[:-1]):
        raise ValueError("an export must end with its `end` line, and only there")
    return lines
