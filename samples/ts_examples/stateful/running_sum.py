"""A stateful handler of this project's: a running sum per sequence, as a client sees it.

Each request's body is a whole number, or ``die`` (the worker kills itself: a worker lost
mid-sequence) or ``sleep S`` (holds its worker S seconds, counted as 0). The answer, JSON: the sum
of the sequence so far, how many requests it has seen, and the start and end headers the frontend
gave (``ts_request_sequence_start``, ``ts_request_sequence_end``). A sequence starts afresh at its
start header, and its state is dropped at its end. Its load takes the model-config.yaml's
``handler.load_seconds`` (0 when absent)."""

import json
import os
import signal
import time

from ts.torch_handler.base_handler import BaseHandler


class RunningSum(BaseHandler):
    def initialize(self, context):
        self.sums = {}
        time.sleep(float(((context.model_yaml_config or {}).get("handler") or {}).get("load_seconds") or 0))
        self.initialized = True

    def handle(self, data, context):
        answers = []
        for idx, row in enumerate(data):
            sequence = context.get_sequence_id(idx)
            start = str(context.get_request_header(idx, "ts_request_sequence_start")).lower() == "true"
            end = str(context.get_request_header(idx, "ts_request_sequence_end")).lower() == "true"
            body = row.get("data") if row.get("data") is not None else row.get("body")
            text = bytes(body).decode() if isinstance(body, (bytes, bytearray)) else str(body)
            words = text.split() or ["0"]
            if words[0] == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            value = 0
            if words[0] == "sleep":
                time.sleep(float(words[1]))
            else:
                value = int(words[0])
            total, count = (0, 0) if start else self.sums.get(sequence, (0, 0))
            total, count = total + value, count + 1
            if end:
                self.sums.pop(sequence, None)
            else:
                self.sums[sequence] = (total, count)
            answers.append(json.dumps({"sum": total, "count": count, "start": start, "end": end}))
        return answers
