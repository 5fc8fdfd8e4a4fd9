"""A bare HTTP/2 client (standard library only), for what a gRPC client library never sends: gRPC
messages begun and left half sent on many streams, within the windows the server grants."""

import select
import socket
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_HEADERS, ACK = 0x4, 0x1
INITIAL_WINDOW_SIZE = 4
FRAME = 16384  # bytes of DATA a frame (the default SETTINGS_MAX_FRAME_SIZE)


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def hpack_string(text: str) -> bytes:
    data, out, value = text.encode(), b"", len(text.encode())
    if value < 127:
        return bytes([value]) + data
    out, value = bytes([127]), value - 127
    while value >= 128:
        out, value = out + bytes([value & 127 | 128]), value >> 7
    return out + bytes([value]) + data


def headers(pairs) -> bytes:
    """HPACK literal header fields without indexing, new names (no table, no Huffman)."""
    return b"".join(b"\x00" + hpack_string(name) + hpack_string(value) for name, value in pairs)


class HalfSent:
    """One HTTP/2 connection from ``source`` opening ``count`` gRPC calls to ``path``, each a message
    announcing ``declared`` bytes of which ``sent`` are sent (as fast as the server's windows allow),
    then nothing more: the calls stay open until ``close()``. ``metadata``: more headers of each call
    (``authorization``)."""

    def __init__(
        self,
        port: int,
        path: str,
        count: int,
        declared: int,
        sent: int,
        source: str = "127.0.0.1",
        metadata: tuple = (),
    ):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
        self.sock.setblocking(False)
        self.path, self.port, self.inbox = path, port, b""
        self.window, self.initial, self.stream_window = 65535, 65535, {}
        self.left = {}  # stream -> the bytes of its message still to send
        self.reset = set()  # streams the server ended
        self.send_all(PREFACE + frame(SETTINGS, 0, 0))
        for index in range(count):
            stream = 2 * index + 1
            pairs = [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", f"127.0.0.1:{port}"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *metadata,
            ]
            self.send_all(frame(HEADERS, END_HEADERS, stream, headers(pairs)))
            self.stream_window[stream] = self.initial
            self.left[stream] = memoryview(b"\x00" + struct.pack(">I", declared) + bytes(sent))

    def send_all(self, data: bytes, deadline: float = 30):
        end = time.monotonic() + deadline
        while data:
            _, ready, _ = select.select([], [self.sock], [], 0.5)
            if ready:
                data = data[self.sock.send(data) :]
            self.read(0)
            if time.monotonic() > end:
                raise TimeoutError("the server read nothing for 30 s")

    def read(self, wait: float):
        """Read what the server sent within ``wait`` s, and act on its frames."""
        readable, _, _ = select.select([self.sock], [], [], wait)
        if not readable:
            return
        try:
            chunk = self.sock.recv(1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.inbox += chunk
        while len(self.inbox) >= 9:
            length = int.from_bytes(self.inbox[:3], "big")
            if len(self.inbox) < 9 + length:
                break
            kind, flags = self.inbox[3], self.inbox[4]
            stream = int.from_bytes(self.inbox[5:9], "big") & 0x7FFFFFFF
            payload, self.inbox = self.inbox[9 : 9 + length], self.inbox[9 + length :]
            self.on_frame(kind, flags, stream, payload)

    def on_frame(self, kind: int, flags: int, stream: int, payload: bytes):
        if kind == SETTINGS and not flags & ACK:
            for at in range(0, len(payload), 6):
                key, value = struct.unpack(">HI", payload[at : at + 6])
                if key == INITIAL_WINDOW_SIZE:
                    for known in self.stream_window:
                        self.stream_window[known] += value - self.initial
                    self.initial = value
            self.sock.send(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            self.sock.send(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            grant = int.from_bytes(payload, "big") & 0x7FFFFFFF
            if stream == 0:
                self.window += grant
            elif stream in self.stream_window:
                self.stream_window[stream] += grant
        elif kind in (RST_STREAM, HEADERS) and stream:
            self.reset.add(stream)  # HEADERS from the server here: its answer (trailers only: refused)
        elif kind == GOAWAY:
            raise ConnectionError(f"the server sent GOAWAY {payload[:64]!r}")

    def pump(self, seconds: float):
        """Send what the windows allow for ``seconds``; the bytes still unsent."""
        end = time.monotonic() + seconds
        while time.monotonic() < end and any(self.left[s] for s in self.left if s not in self.reset):
            sent = False
            for stream, data in self.left.items():
                size = min(len(data), FRAME, self.window, self.stream_window[stream])
                if stream in self.reset or size <= 0:
                    continue
                self.send_all(frame(DATA, 0, stream, bytes(data[:size])))
                self.left[stream], self.window = data[size:], self.window - size
                self.stream_window[stream] -= size
                sent = True
            self.read(0 if sent else 0.2)
        return sum(len(d) for s, d in self.left.items() if s not in self.reset)

    def close(self):
        self.sock.close()
