"""Protobuf messages read off their wire bytes, without parsing them: what a gRPC call holds is weighed,
and the parts of it that matter (a packed field, a map's entries in their order) read, before or
instead of building the message (serving/engine/kserve_grpc.py, serving/engine/ts_grpc.py)."""


def wire_fields(wire: memoryview):
    """(field number, payload) of each field of a protobuf message's wire bytes, read off the bytes
    without parsing: ``payload`` the bytes of a length-delimited field, None for a scalar (varint,
    fixed32, fixed64). ValueError for a group (wire types 3 and 4, which no field here uses)."""
    at = 0
    while at < len(wire):
        key, at = varint_at(wire, at)
        kind = key & 7
        if kind == 2:
            length, at = varint_at(wire, at)
            yield key >> 3, wire[at : at + length]
            at += length
            continue
        if kind == 0:
            _, at = varint_at(wire, at)
        elif kind in (1, 5):
            at += 8 if kind == 1 else 4
        else:
            raise ValueError(f"the request is no protobuf message (wire type {kind})")
        yield key >> 3, None


def varint_at(wire: memoryview, at: int):
    value = shift = 0
    while True:
        byte = wire[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at
