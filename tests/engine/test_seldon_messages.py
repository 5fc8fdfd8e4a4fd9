"""The Seldon protocol of serving/runtimes/seldon_components.py in this process (no wrapper, no model): any JSON is
either read as the message it is or refused with a ClientError (Seldon's 4xx, alone), and a message cannot
make a unit allocate past its limits. The components under the real wrapper: tests/engine/test_seldon_core1.py
(make matrix)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.protocol import ClientError, Limits
from serving.runtimes import seldon_components as seldon
from serving.runtimes.seldon_bounds import Bounds

LIMITS = Limits(max_items=32, max_body_bytes=1 << 20, max_json_depth=32, max_json_values=1000, max_batch_bytes=1 << 24)
BOUNDS = Bounds.of(LIMITS, memory=1 << 30)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                ["data", "binData", "strData", "jsonData", "meta", "ndarray", "tensor", "shape", "values", "names"]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_any_json_is_read_or_refused_as_a_client_error(request):
    for read in (
        lambda r: seldon.message_of(r, BOUNDS),
        lambda r: seldon.images_of(seldon.message_of(r, BOUNDS), LIMITS),
        lambda r: seldon.tensor_of(seldon.message_of(r, BOUNDS), LIMITS),
    ):
        try:
            read(request)
        except ClientError:
            pass


def test_a_tensor_is_read_in_its_shape_and_answered_with_names_and_meta():
    message = {"data": {"names": ["a", "b"], "tensor": {"shape": [2, 2], "values": [1, 2, 3, 4]}}, "meta": {"x": 1}}
    array = seldon.tensor_of(seldon.message_of(message, BOUNDS), LIMITS)
    assert array.dtype == np.float32 and array.shape == (2, 2)
    assert seldon.answer(message, "tensor", array * 2) == {
        "data": {"names": ["a", "b"], "tensor": {"shape": [2, 2], "values": [2.0, 4.0, 6.0, 8.0]}},
        "meta": {"x": 1},
    }
    assert seldon.images_of({"binData": "aGk="}, LIMITS) == ["aGk="]
    assert seldon.images_of({"jsonData": [{"b64": "aGk="}, "aGk="]}, LIMITS) == [{"b64": "aGk="}, "aGk="]


@pytest.mark.parametrize(
    "message, words",
    [
        ({"data": {"tensor": {"shape": [10**9, 10**9], "values": [1]}}}, "max_json_values"),  # refused before numpy
        ({"data": {"tensor": {"shape": [3], "values": [1, 2]}}}, "holds 3 values, got 2"),
        ({"data": {"ndarray": [[1, 2], [3]]}}, "not a rectangular list of numbers"),
        ({"data": {"ndarray": [["a"]]}}, "not a rectangular list of numbers"),
        ({"data": {"ndarray": [0] * 1001}}, "max_json_values"),
        ({"strData": "x", "binData": "y"}, "holds one of"),
        ({"data": {"ndarray": [1]}, "meta": []}, "meta must be an object"),
        ({"data": {"tftensor": {}}}, "data must hold one of ndarray or tensor"),
        ({"jsonData": ["aGk="] * 33}, "max_items"),
        ({"jsonData": []}, "holds no image"),
        # the wrapper's Flask reads NaN and Infinity (1e400 too) where JSON has none: answered, they made a 200
        # whose body was not JSON (NaN in it) from a model fed them, and from transform-output
        ({"data": {"ndarray": [[1.0, float("nan")]]}}, "NaN or Infinity"),
        ({"data": {"tensor": {"shape": [2], "values": [float("inf"), 1]}}}, "NaN or Infinity"),
        ({"data": {"ndarray": [[-float("inf")]]}}, "NaN or Infinity"),
    ],
)
def test_bad_messages_are_client_errors_naming_the_problem(message, words):
    with pytest.raises(ClientError, match=words):
        reader = seldon.images_of if "jsonData" in message or "strData" in message else seldon.tensor_of
        reader(seldon.message_of(message, BOUNDS), LIMITS)


def test_the_router_draws_children_by_weight():
    router = seldon.Router("60,30,10")
    router.random.seed(7)
    drawn = [router.route_raw({"data": {"ndarray": [[1]]}, "meta": {"m": 1}}) for _ in range(3000)]
    assert all(d["meta"] == {"m": 1} for d in drawn)
    counts = np.bincount([d["data"]["ndarray"][0][0] for d in drawn], minlength=3) / 3000
    assert np.allclose(counts, [0.6, 0.3, 0.1], atol=0.04), counts
    for weights in ("1", "2,0", "a,b"):
        with pytest.raises(ValueError, match="parameter weights"):
            seldon.Router(weights)


def test_a_multipart_file_in_bin_data_is_read_as_the_image():
    """The wrapper reads a multipart/form-data file field binData as its base64 *bytes* (flask_utils.py
    ``get_multi_form_data_request``, for protobuf to decode): the image, as Seldon's own models get it."""
    assert seldon.images_of({"binData": b"aGk="}, LIMITS) == ["aGk="]


def test_a_units_limits_are_what_its_memory_affords():
    """The export's 256 MiB router: its limits are its memory's, not the Model's 64 MiB and 4M values; a meta
    holding NaN or Infinity is refused (400), never answered as a body that is not JSON. Served under the real
    wrapper in a 256 MiB cgroup: tests/engine/test_seldon_router_memory.py (make matrix)."""
    model = Limits(
        max_items=32, max_body_bytes=64 << 20, max_json_depth=32, max_json_values=4_000_000, max_batch_bytes=1 << 30
    )
    router = Bounds.of(model, memory=256 << 20)
    assert router.limits.max_body_bytes < 32 << 20 and router.limits.max_json_values < 2_000_000
    assert Bounds.of(model, memory=64 << 30).limits == model  # a large container keeps the handler's own
    with pytest.raises(ClientError) as refused:
        seldon.message_of({"strData": "", "meta": {"a": [[]] * (router.limits.max_json_values + 1)}}, router)
    assert refused.value.status == 413
    for value in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ClientError, match="NaN or Infinity") as refused:
            seldon.message_of({"strData": "", "meta": {"tags": {"score": value}}}, router)
        assert refused.value.status == 400
    assert seldon.message_of({"strData": "x", "meta": {"tags": {"score": 0.5}}}, router)["meta"]["tags"]["score"] == 0.5
