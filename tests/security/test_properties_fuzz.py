"""Property-based tests: whatever bytes or JSON arrive, the decoders raise nothing but ClientError."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.image import decode_image, open_image
from handlers.protocol import ClientError, encode_answers, parse_request, to_bytes, to_text
from handlers.settings import SAFE_FORMATS

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
v2_like = st.fixed_dictionaries(
    {
        "inputs": st.lists(
            st.dictionaries(st.sampled_from(["name", "shape", "datatype", "data"]), json_values), max_size=2
        )
    }
)
KEYS = ("data", "b64", "text", "inputs")


def decode_everything(row):
    try:
        request = parse_request(row, KEYS)
    except ClientError:
        return
    assert request.items, "a parsed request always holds at least one item"
    for item in request.items:
        for decode in (to_bytes, to_text):
            try:
                decode(item)
            except ClientError:
                pass
    encode_answers(request, [None] * len(request.items), "m")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes(body):
    decode_everything({"body": body})


@settings(max_examples=300, deadline=None)
@given(json_values | v2_like | st.fixed_dictionaries({"instances": json_values}))
def test_arbitrary_json_as_parsed_or_raw(value):
    decode_everything({"body": value})
    decode_everything({"body": json.dumps(value).encode()})
    decode_everything({"data": json.dumps(value)})


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff\xe0", b"GIF89a", b"BM", b""]))
def test_arbitrary_image_bytes(tail, magic):
    for formats in (SAFE_FORMATS, None):
        try:
            decode_image(open_image(magic + tail, formats, 89_478_485), 256, 224, 256)
        except ClientError as error:
            assert error.status in (400, 413)
