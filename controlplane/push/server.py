"""The gRPC server of a replica: the Fleet service on the gRPC port, TLS when configured."""

from __future__ import annotations

import grpc

from controlplane.errors import PortUnavailable
from controlplane.push.service import FleetService
from controlplane.settings import Settings

# The server pings idle connections and accepts the agents' pings, so a dead peer (a
# powered-off node, a cut link) is noticed in seconds rather than at the TCP timeout.
SERVER_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.so_reuseport", 0),  # two replicas on one port must fail, not share it
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    key = settings.tls_key_file.read_bytes()
    cert = settings.tls_cert_file.read_bytes()
    client_ca = settings.tls_client_ca_file.read_bytes() if settings.tls_client_ca_file else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


async def start_grpc(service: FleetService, settings: Settings) -> grpc.aio.Server:
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers((service.handler(),))
    address = f"{settings.host}:{settings.grpc_port}"
    credentials = server_credentials(settings)
    try:
        if credentials is None:
            server.add_insecure_port(address)
        else:
            server.add_secure_port(address, credentials)
    except RuntimeError as error:  # grpcio's way of saying the port cannot be bound
        raise PortUnavailable(
            f"the gRPC port {address} cannot be bound (in use?); choose another with "
            "--grpc-port or MERIDIAN_GRPC_PORT"
        ) from error
    await server.start()
    return server
