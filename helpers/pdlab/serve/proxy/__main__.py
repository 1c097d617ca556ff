"""``python -m pdlab.serve.proxy``: run the P/D proxy (:func:`pdlab.serve.proxy.server.main`)."""

from pdlab.serve.proxy.server import main

__all__: list[str] = []

if __name__ == "__main__":  # pragma: no cover
    main()
