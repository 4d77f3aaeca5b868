"""The generated protobuf messages and gRPC stubs of `proto/leasehold.proto`, for
calling the API directly (`Client.raw_node(endpoint)` gives a node's stubs, with
`metadata=client.metadata` for the credential): no leader following, no retries.

* `messages` — the request, response and enum types (`messages.AcquireRequest`,
  `messages.ErrorReason`, …).
* `services` — the stubs (`services.LeaseholdStub`, `SemaphoresStub`,
  `ElectionsStub`, `AdminStub`).
"""

from leasehold._proto import leasehold_pb2 as messages
from leasehold._proto import leasehold_pb2_grpc as services

__all__ = ["messages", "services"]
