"""Modules generated while the package is built (see setup.py); not checked in.

* `leasehold_pb2`, `leasehold_pb2_grpc`: the messages and service stubs of
  `proto/proto/leasehold.proto`, the wire API.
* `rich_status_pb2`: wire-compatible copies of `google.rpc.Status` and
  `google.rpc.ErrorInfo` (`protos/rich_status.proto`), for reading typed errors.
"""
