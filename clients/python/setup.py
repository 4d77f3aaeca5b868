"""Builds the `leasehold` package, generating its gRPC stubs on the way.

The stubs are not checked in: every build compiles them with grpcio-tools from

* `proto/proto/leasehold.proto` of the repository (two folders up), the one source of
  the wire API; an sdist carries a copy of it in `protos/leasehold.proto` instead;
* `protos/rich_status.proto`, this package's own wire-compatible copy of
  `google.rpc.Status` and `google.rpc.ErrorInfo`, for reading the typed errors.

They are written to `src/leasehold/_proto/` (ignored by git), so that regular,
editable and sdist builds all find them. The runtime requirements are those of the
grpcio-tools that compiled them: its generated code refuses an older grpcio or
protobuf at import time, so the package asks for at least those versions.
"""

from __future__ import annotations

import shutil
import tempfile
from importlib import metadata, resources
from pathlib import Path
from typing import List

from setuptools import Command, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

PACKAGE_ROOT = Path(__file__).resolve().parent
REPOSITORY_PROTO = PACKAGE_ROOT.parent.parent / "proto" / "proto" / "leasehold.proto"
SDIST_PROTO = PACKAGE_ROOT / "protos" / "leasehold.proto"
RICH_STATUS_PROTO = PACKAGE_ROOT / "protos" / "rich_status.proto"
SOURCE_ROOT = PACKAGE_ROOT / "src"
# Where the generated modules live, as a Python package path and as a folder.
STUBS_PACKAGE = ("leasehold", "_proto")
STUBS_DIRECTORY = SOURCE_ROOT.joinpath(*STUBS_PACKAGE)


def leasehold_proto() -> Path:
    """The wire API's .proto: the repository's, else the copy an sdist carries."""
    for candidate in (REPOSITORY_PROTO, SDIST_PROTO):
        if candidate.is_file():
            return candidate
    raise SystemExit(
        f"leasehold.proto not found: neither {REPOSITORY_PROTO} (building from the repository) "
        f"nor {SDIST_PROTO} (building from an sdist) exists"
    )


def generate_stubs() -> None:
    """Compiles the .proto files into `src/leasehold/_proto/`.

    Each file is staged as `leasehold/_proto/NAME.proto` and compiled from there, so
    that the generated modules import each other as `leasehold._proto.…` (protoc
    derives import paths from the include path).
    """
    from grpc_tools import protoc

    well_known = str(resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory(prefix="leasehold-protos-") as staging_text:
        staging = Path(staging_text)
        staged = staging.joinpath(*STUBS_PACKAGE)
        staged.mkdir(parents=True)
        shutil.copyfile(leasehold_proto(), staged / "leasehold.proto")
        shutil.copyfile(RICH_STATUS_PROTO, staged / "rich_status.proto")
        relative = "/".join(STUBS_PACKAGE)
        runs = [
            # The services need the gRPC plugin's output too; the status types do not.
            [f"--grpc_python_out={SOURCE_ROOT}", f"{relative}/leasehold.proto"],
            [f"{relative}/rich_status.proto"],
        ]
        for extra in runs:
            arguments = [
                "grpc_tools.protoc",
                f"-I{staging}",
                f"-I{well_known}",
                f"--python_out={SOURCE_ROOT}",
                f"--pyi_out={SOURCE_ROOT}",
                *extra,
            ]
            if protoc.main(arguments) != 0:
                raise SystemExit(f"protoc failed: {' '.join(arguments)}")


def runtime_requirements() -> List[str]:
    """grpcio and protobuf, at least the versions the stubs are generated for."""
    tools_version = metadata.version("grpcio-tools")
    protobuf = [
        requirement.split(";")[0].strip()
        for requirement in metadata.requires("grpcio-tools") or []
        if requirement.replace(" ", "").lower().startswith("protobuf")
    ]
    return [f"grpcio>={tools_version}", *(protobuf or ["protobuf>=4.21"])]


class BuildWithStubs(build_py):
    """`build_py` that first generates the stubs."""

    def run(self) -> None:
        generate_stubs()
        super().run()


class SdistWithProto(sdist):
    """`sdist` that carries a copy of leasehold.proto, for builds outside the repository."""

    def run(self) -> None:
        if REPOSITORY_PROTO.is_file():
            shutil.copyfile(REPOSITORY_PROTO, SDIST_PROTO)
        super().run()


class Stubs(Command):
    """`python setup.py stubs`: only generate the stubs (for working in the source tree)."""

    description = "generate the gRPC stubs into src/leasehold/_proto"
    user_options: List[tuple] = []

    def initialize_options(self) -> None:
        pass

    def finalize_options(self) -> None:
        pass

    def run(self) -> None:
        generate_stubs()


setup(
    install_requires=runtime_requirements(),
    cmdclass={"build_py": BuildWithStubs, "sdist": SdistWithProto, "stubs": Stubs},
)
