"""grpc.health.v1 follows readiness; reflection lists every service; stop drains and ends health."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from proxy._proto.radixgate.v1 import generate_pb2 as pb
from proxy._proto.radixgate.v1 import generate_pb2_grpc as pb_grpc
from proxy.app import App
from proxy.sim.config import SimConfig
from proxy.sim.fleet import Fleet
from tests.integration.conftest import FAST, Harness, eventually

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
async def proxied(harness: Harness) -> AsyncIterator[tuple[Fleet, App, grpc.aio.Channel]]:
    fleet = await harness.fleet([SimConfig(time_scale=FAST), SimConfig(time_scale=FAST)])
    app = await harness.proxy(fleet.urls, server__grpc_port=-1)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")
    yield fleet, app, channel
    await channel.close()


async def check(stub: health_pb2_grpc.HealthStub, service: str = "") -> int:
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return int(reply.status)


async def test_check_and_watch_follow_readiness_when_all_workers_go_down_and_come_back(
    proxied: tuple[Fleet, App, grpc.aio.Channel],
) -> None:
    fleet, _, channel = proxied
    stub = health_pb2_grpc.HealthStub(channel)
    assert await check(stub) == SERVING
    assert await check(stub, "radixgate.v1.Generation") == SERVING
    watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
    assert (await watch.read()).status == SERVING

    for w in fleet.workers:
        await w.stop()
    down = await asyncio.wait_for(watch.read(), 10)
    assert down.status == NOT_SERVING
    assert await check(stub) == NOT_SERVING
    assert await check(stub, "radixgate.v1.Generation") == NOT_SERVING
    assert await check(stub, "radixgate.v1.Admin") == SERVING  # the admin service needs no worker

    await fleet.workers[0].start()
    up = await asyncio.wait_for(watch.read(), 10)
    assert up.status == SERVING
    assert await check(stub) == SERVING
    watch.cancel()


async def test_an_unknown_health_service_is_not_found(proxied: tuple[Fleet, App, grpc.aio.Channel]) -> None:
    _, _, channel = proxied
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await check(health_pb2_grpc.HealthStub(channel), "no.such.Service")
    assert info.value.code() is grpc.StatusCode.NOT_FOUND


async def reflect(channel: grpc.aio.Channel, request: reflection_pb2.ServerReflectionRequest
                  ) -> reflection_pb2.ServerReflectionResponse:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = stub.ServerReflectionInfo(timeout=5)
    await call.write(request)
    await call.done_writing()
    reply = await call.read()
    assert isinstance(reply, reflection_pb2.ServerReflectionResponse)
    return reply


async def test_reflection_lists_the_radixgate_health_and_reflection_services(
    proxied: tuple[Fleet, App, grpc.aio.Channel],
) -> None:
    _, _, channel = proxied
    listed = await reflect(channel, reflection_pb2.ServerReflectionRequest(list_services=""))
    names = {s.name for s in listed.list_services_response.service}
    assert names == {"radixgate.v1.Generation", "radixgate.v1.Admin", "grpc.health.v1.Health",
                     "grpc.reflection.v1alpha.ServerReflection", "grpc.reflection.v1.ServerReflection"}


async def reflect_v1(channel: grpc.aio.Channel, request: reflection_pb2.ServerReflectionRequest
                     ) -> reflection_pb2.ServerReflectionResponse:
    """A v1 client (grpcurl's first choice): the v1 method path; v1's messages are v1alpha's, field for field."""
    info = channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                                 request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                 response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
    call = info(timeout=5)
    await call.write(request)
    await call.done_writing()
    reply = await call.read()
    assert isinstance(reply, reflection_pb2.ServerReflectionResponse)
    return reply


async def test_reflection_v1_lists_the_services_and_serves_descriptors_and_its_own_schema(
    proxied: tuple[Fleet, App, grpc.aio.Channel],
) -> None:
    _, _, channel = proxied
    listed = await reflect_v1(channel, reflection_pb2.ServerReflectionRequest(list_services=""))
    names = {s.name for s in listed.list_services_response.service}
    assert {"radixgate.v1.Generation", "grpc.reflection.v1.ServerReflection"} <= names
    reply = await reflect_v1(channel, reflection_pb2.ServerReflectionRequest(
        file_containing_symbol="radixgate.v1.Generation"))
    files = [descriptor_pb2.FileDescriptorProto.FromString(raw)
             for raw in reply.file_descriptor_response.file_descriptor_proto]
    assert "radixgate.v1" in {f.package for f in files}
    # grpcurl describe grpc.reflection.v1.ServerReflection: v1's own file, with v1's types.
    reply = await reflect_v1(channel, reflection_pb2.ServerReflectionRequest(
        file_containing_symbol="grpc.reflection.v1.ServerReflection"))
    (v1,) = [descriptor_pb2.FileDescriptorProto.FromString(raw)
             for raw in reply.file_descriptor_response.file_descriptor_proto]
    assert v1.name == "grpc/reflection/v1/reflection.proto" and v1.package == "grpc.reflection.v1"
    (method,) = v1.service[0].method
    assert method.input_type == ".grpc.reflection.v1.ServerReflectionRequest"


async def test_reflection_serves_the_descriptors_a_generic_client_needs(
    proxied: tuple[Fleet, App, grpc.aio.Channel],
) -> None:
    _, _, channel = proxied
    reply = await reflect(channel, reflection_pb2.ServerReflectionRequest(
        file_containing_symbol="radixgate.v1.Generation"))
    files = [descriptor_pb2.FileDescriptorProto.FromString(raw)
             for raw in reply.file_descriptor_response.file_descriptor_proto]
    (generate_file,) = [f for f in files if f.package == "radixgate.v1"]
    (service,) = generate_file.service
    assert {m.name for m in service.method} == {"Generate", "GenerateUnary"}
    assert "GenerateRequest" in {m.name for m in generate_file.message_type}


async def test_stop_turns_health_not_serving_refuses_new_calls_and_lets_a_running_stream_finish(
    harness: Harness,
) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=1.0)])  # real time: the stream outlives the drain start
    app = await harness.proxy(fleet.urls, server__grpc_port=-1)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        generation = pb_grpc.GenerationStub(channel)
        request = pb.GenerateRequest(text="a b c d", sampling=pb.SamplingParams(max_new_tokens=60, ignore_eos=True))
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert (await watch.read()).status == SERVING
        call = generation.Generate(request, timeout=30)
        assert (await call.read()).token_count > 0  # the stream is running
        stopping = asyncio.get_running_loop().create_task(app.stop(10.0))
        assert (await asyncio.wait_for(watch.read(), 5)).status == NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await generation.GenerateUnary(request, timeout=5)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        rest = []
        while (chunk := await call.read()) is not grpc.aio.EOF:
            rest.append(chunk)
        assert len(rest) > 2, "the stream was still running when the drain began"
        assert rest[-1].final.finish_reason == "length" and rest[-1].final.completion_tokens == 60
        assert await call.code() is grpc.StatusCode.OK
        await stopping
        await eventually(lambda: _refused(channel), what="server closed")


async def _refused(channel: grpc.aio.Channel) -> bool:
    try:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
    except grpc.aio.AioRpcError as e:
        return e.code() is grpc.StatusCode.UNAVAILABLE
    return False
