"""A stand-in for the ``lru-dict`` package's ``LRU`` (what pytorch/serve's stateful example imports): a
dict keeping its ``capacity`` most recently used keys."""

from collections import OrderedDict


class LRU(OrderedDict):
    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def has_key(self, key) -> bool:
        return key in self

    def __getitem__(self, key):
        value = super().__getitem__(key)
        self.move_to_end(key)
        return value

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.capacity:
            self.popitem(last=False)
