"""What the writer writes, inside one transaction each: a batch of rows, a deployment."""

from dataclasses import dataclass, field

from sqlalchemy import Connection, insert, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from db.tables import (
    DeploymentRow,
    GpuRow,
    GpuSample,
    MetricSample,
    NodeRow,
    RequestRecord,
    insert_values,
)


@dataclass(slots=True)
class WriteBatch:
    """Rows gathered over a second or so, written in one transaction."""

    metric_samples: list[MetricSample] = field(default_factory=list)
    gpu_samples: list[GpuSample] = field(default_factory=list)
    request_records: list[RequestRecord] = field(default_factory=list)
    nodes: list[NodeRow] = field(default_factory=list)  # upserted by name
    gpus: list[GpuRow] = field(default_factory=list)  # upserted by (node_name, gpu_index)

    @property
    def num_rows(self) -> int:
        return (
            len(self.metric_samples)
            + len(self.gpu_samples)
            + len(self.request_records)
            + len(self.nodes)
            + len(self.gpus)
        )

    def extend(self, other: "WriteBatch") -> None:
        self.metric_samples.extend(other.metric_samples)
        self.gpu_samples.extend(other.gpu_samples)
        self.request_records.extend(other.request_records)
        self.nodes.extend(other.nodes)
        self.gpus.extend(other.gpus)


def write_batch(connection: Connection, batch: WriteBatch) -> None:
    for table, rows in (
        (MetricSample, batch.metric_samples),
        (GpuSample, batch.gpu_samples),
        (RequestRecord, batch.request_records),
    ):
        if rows:
            connection.execute(insert(table), [insert_values(row) for row in rows])
    for node in batch.nodes:
        _upsert(connection, NodeRow, node, ("name",))
    for gpu in batch.gpus:
        _upsert(connection, GpuRow, gpu, ("node_name", "gpu_index"))


def _upsert(
    connection: Connection, table: type[NodeRow | GpuRow], row: NodeRow | GpuRow, keys: tuple
) -> None:
    values = insert_values(row)
    statement = sqlite_insert(table).values(values)
    updates = {name: value for name, value in values.items() if name not in keys}
    connection.execute(statement.on_conflict_do_update(index_elements=list(keys), set_=updates))


def add_deployment(connection: Connection, row: DeploymentRow) -> int:
    result = connection.execute(insert(DeploymentRow).values(insert_values(row)))
    return int(result.inserted_primary_key[0])


def set_deployment_status(
    connection: Connection,
    deployment_id: int,
    status: str,
    message: str | None,
    endpoint: str | None,
) -> bool:
    values: dict[str, str | None] = {"status": status, "status_message": message}
    if endpoint is not None:
        values["endpoint"] = endpoint
    result = connection.execute(
        update(DeploymentRow).where(DeploymentRow.id == deployment_id).values(values)
    )
    return result.rowcount == 1
