"""Where a server ``tsctl serve`` starts listens: ``LOOPBACK`` unless ``--host`` says otherwise, and how an
address is spelled for it to bind (``bind_address``) and for a client on this machine (``client_address``)."""

LOOPBACK = "127.0.0.1"


def bind_address(host: str, port: int) -> str:
    """HOST:PORT as TorchServe's addresses spell it (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def client_address(host: str, port: int) -> str:
    """HOST:PORT of a listener bound on ``host`` as a client on this machine reaches it: every address of the
    machine (0.0.0.0, ::) through the loopback; an IPv6 address in brackets."""
    return bind_address({"0.0.0.0": LOOPBACK, "::": "::1", "": LOOPBACK}.get(host, host), port)
