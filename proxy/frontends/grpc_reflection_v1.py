"""gRPC server reflection: ``grpc.reflection.v1.ServerReflection`` beside ``v1alpha``.

grpcurl, Postman, grpcui and recent grpc-go / grpc-java clients ask ``v1`` first. grpcio-reflection
for Python (1.85) ships only ``v1alpha``, and ``v1`` is the same protocol under a new package: the
same messages, field for field (``grpc/reflection/v1/reflection.proto`` is a copy of the v1alpha
file with the package renamed). So ``v1`` is served by grpcio-reflection's own servicer, its
messages read and written with the v1alpha classes (the bytes on the wire are identical), and the
``v1`` file descriptor — derived from v1alpha's, package renamed — is added to the descriptor pool,
so a client can ask for ``v1``'s own schema too (``grpcurl describe``).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

V1_SERVICE = "grpc.reflection.v1.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"
_ALPHA = "grpc.reflection.v1alpha"
_V1 = "grpc.reflection.v1"


def _register_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    """Add the v1 file to ``pool`` (once: a later call finds it there)."""
    try:
        pool.FindFileByName(V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name, proto.package = V1_FILE, _V1
    proto.options.Clear()
    proto.options.java_package, proto.options.java_multiple_files = "io.grpc.reflection.v1", True

    def renamed(type_name: str) -> str:
        return type_name.replace(f".{_ALPHA}.", f".{_V1}.", 1)

    for message in proto.message_type:
        for field in message.field:
            if field.type_name:
                field.type_name = renamed(field.type_name)
    for service in proto.service:
        for method in service.method:
            method.input_type, method.output_type = renamed(method.input_type), renamed(method.output_type)
    pool.Add(proto)


def enable(server: grpc.aio.Server, service_names: Sequence[str]) -> None:
    """Serve reflection ``v1alpha`` and ``v1`` on ``server``; both list ``service_names`` and themselves."""
    _register_v1_descriptor(descriptor_pool.Default())
    names = (*service_names, reflection.SERVICE_NAME, V1_SERVICE)
    reflection.enable_server_reflection(names, server)
    servicer = ReflectionServicer(names)
    handler = grpc.method_handlers_generic_handler(V1_SERVICE, {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString),
    })
    server.add_generic_rpc_handlers((handler,))
