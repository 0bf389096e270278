"""moto's S3 server for tests/e2e/test_s3a_checkpoint.py, answering `Expect: 100-continue` once, as S3 does.

`python -m moto.server` (moto 5.2.5, werkzeug 3.1.9) answers it twice: CPython's `BaseHTTPRequestHandler.parse_request`
writes `HTTP/1.1 100 Continue` (`handle_expect_100`, since werkzeug serves HTTP/1.1 when threaded) and werkzeug's
`run_wsgi` writes another. S3A's `copyFromLocalFile`, which RocksDB's state store uploads every SST file with, goes
through the AWS SDK's transfer manager on the async Netty client: it sends the body on the first 100 and takes the
second for the final response, so the upload fails with `S3Exception ... Status Code: 100` (getmoto/moto#9975,
closed unmerged). The rest of the server is moto's, unchanged.

Run as `python s3_server.py HOST PORT`.
"""

from __future__ import annotations

import sys

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple


class OneContinueHandler(MotoRequestHandler):
    def handle_expect_100(self) -> bool:
        # werkzeug's run_wsgi writes the one interim 100 (the test checks there is exactly one on the wire).
        return True


def main(host: str, port: int) -> None:
    run_simple(
        host,
        port,
        DomainDispatcherApplication(create_backend_app),
        threaded=True,
        request_handler=OneContinueHandler,
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
