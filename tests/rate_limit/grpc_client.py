"""A gRPC client that is not tonic: Python's grpcio (gRPC C-core), for tests/rate_limit/grpc.rs.

    python3 grpc_client.py ADDR MODE

MODE is one of:
  rapid            six calls as fast as they go; prints what the sixth got
  retry-unavailable  one call whose retry policy lists only UNAVAILABLE
  retry-exhausted    one call whose retry policy lists RESOURCE_EXHAUSTED

Each prints one JSON line. The request is HelloRequest { name = "py" }, encoded by hand (field 1,
a string), so no generated code is needed.
"""

import json
import sys
import time

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

METHOD = "/helloworld.Greeter/SayHello"
REQUEST = b"\x0a\x02py"


def channel(addr, codes=None):
    options = []
    if codes is not None:
        config = {
            "methodConfig": [
                {
                    "name": [{"service": "helloworld.Greeter"}],
                    "retryPolicy": {
                        "maxAttempts": 2,
                        "initialBackoff": "0.001s",
                        "maxBackoff": "0.001s",
                        "backoffMultiplier": 1,
                        "retryableStatusCodes": codes,
                    },
                }
            ]
        }
        options = [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(config))]
    return grpc.insecure_channel(addr, options=options)


def call(ch):
    stub = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
    return stub(REQUEST, timeout=10)


def refusal(err):
    """What a refusal told: its code, pushback and the delay of its RetryInfo."""
    trailing = dict(err.trailing_metadata() or ())
    out = {"code": err.code().name, "pushback": trailing.get("grpc-retry-pushback-ms")}
    out["message"] = err.details()
    status = rpc_status.from_call(err)
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                info = error_details_pb2.RetryInfo()
                detail.Unpack(info)
                out["retry_delay_ms"] = info.retry_delay.seconds * 1000 + info.retry_delay.nanos // 1_000_000
            if detail.Is(error_details_pb2.QuotaFailure.DESCRIPTOR):
                failure = error_details_pb2.QuotaFailure()
                detail.Unpack(failure)
                out["violations"] = [v.subject for v in failure.violations]
    return out


def main():
    addr, mode = sys.argv[1], sys.argv[2]
    if mode == "rapid":
        ch = channel(addr)
        ok = 0
        for _ in range(6):
            try:
                call(ch)
                ok += 1
            except grpc.RpcError as err:
                print(json.dumps({"ok": ok, **refusal(err)}))
                return
        print(json.dumps({"ok": ok}))
    else:
        codes = ["UNAVAILABLE"] if mode == "retry-unavailable" else ["RESOURCE_EXHAUSTED"]
        ch = channel(addr, codes)
        start = time.monotonic()
        try:
            call(ch)
            out = {"code": "OK"}
        except grpc.RpcError as err:
            out = refusal(err)
        out["elapsed_ms"] = (time.monotonic() - start) * 1000
        print(json.dumps(out))


if __name__ == "__main__":
    main()
