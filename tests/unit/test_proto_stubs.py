"""The committed stubs in proxy/_proto match protos/ (CI catches a .proto edited without regenerating)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from proxy._proto.radixgate.v1 import admin_pb2, admin_pb2_grpc, generate_pb2, generate_pb2_grpc

REPO = Path(__file__).resolve().parents[2]


def compile_descriptor_set(proto: str) -> descriptor_pb2.FileDescriptorSet:
    """What protoc makes of the .proto on disk now, named the way the stubs name it."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        rc = protoc.main(
            [
                "protoc",
                f"-Iproxy/_proto={REPO / 'protos'}",
                f"-I{resources.files('grpc_tools') / '_proto'}",
                f"--descriptor_set_out={out}",
                f"proxy/_proto/radixgate/v1/{proto}",
            ]
        )
        assert rc == 0
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def without_json_names(fdp: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """protoc fills json_name; the descriptor embedded in a _pb2 module leaves it derived."""
    stack = list(fdp.message_type)
    while stack:
        message = stack.pop()
        for f in message.field:
            f.ClearField("json_name")
        stack.extend(message.nested_type)
    return fdp


def committed_descriptor(module: object) -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(fdp)  # type: ignore[attr-defined]
    return fdp


def test_regenerating_from_the_proto_files_gives_identical_stub_files() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_protos.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_committed_descriptors_equal_what_the_proto_files_compile_to() -> None:
    for proto, module in (("generate.proto", generate_pb2), ("admin.proto", admin_pb2)):
        (fresh,) = compile_descriptor_set(proto).file
        assert committed_descriptor(module) == without_json_names(fresh), proto


def test_protobuf_package_is_versioned_and_services_are_where_clients_look() -> None:
    assert generate_pb2.DESCRIPTOR.package == "radixgate.v1"
    assert admin_pb2.DESCRIPTOR.package == "radixgate.v1"
    assert set(generate_pb2.DESCRIPTOR.services_by_name) == {"Generation"}
    assert set(admin_pb2.DESCRIPTOR.services_by_name) == {"Admin"}
    generation = generate_pb2.DESCRIPTOR.services_by_name["Generation"]
    assert generation.methods_by_name["Generate"].server_streaming
    assert not generation.methods_by_name["GenerateUnary"].server_streaming


def test_generated_service_modules_import_messages_through_the_proxy_package() -> None:
    for module in (generate_pb2_grpc, admin_pb2_grpc):
        source = Path(module.__file__ or "").read_text()
        assert "from proxy._proto.radixgate.v1 import" in source
        assert "\nfrom radixgate" not in source and "\nimport radixgate" not in source


def test_typed_stubs_ship_beside_every_message_module() -> None:
    for module in (generate_pb2, admin_pb2):
        assert Path(module.__file__ or "").with_suffix(".pyi").is_file()


def test_unset_optional_sampling_fields_are_distinguishable_from_zero() -> None:
    params = generate_pb2.SamplingParams(temperature=0.0)
    assert params.HasField("temperature")
    assert not params.HasField("top_p")
