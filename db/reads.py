"""What the readers ask (the TUI's dashboard, `specctl status`): each a short SELECT."""

from sqlmodel import Session, col, select

from db.tables import DeploymentRow, GpuRow, GpuSample, MetricSample, NodeRow, RequestRecord


def latest_deployment(session: Session) -> DeploymentRow | None:
    statement = select(DeploymentRow).order_by(col(DeploymentRow.id).desc()).limit(1)
    return session.exec(statement).first()


def deployment(session: Session, deployment_id: int) -> DeploymentRow | None:
    return session.get(DeploymentRow, deployment_id)


def deployments(session: Session, limit: int) -> list[DeploymentRow]:
    statement = select(DeploymentRow).order_by(col(DeploymentRow.id).desc()).limit(limit)
    return list(session.exec(statement).all())


def latest_sample(session: Session, deployment_id: int) -> MetricSample | None:
    statement = (
        select(MetricSample)
        .where(MetricSample.deployment_id == deployment_id)
        .order_by(col(MetricSample.time_unix_s).desc(), col(MetricSample.id).desc())
        .limit(1)
    )
    return session.exec(statement).first()


def samples_since(
    session: Session, deployment_id: int, since_unix_s: float, limit: int
) -> list[MetricSample]:
    """Samples at or after `since_unix_s`, oldest first (at most the newest `limit`)."""
    statement = (
        select(MetricSample)
        .where(MetricSample.deployment_id == deployment_id)
        .where(MetricSample.time_unix_s >= since_unix_s)
        .order_by(col(MetricSample.time_unix_s).desc(), col(MetricSample.id).desc())
        .limit(limit)
    )
    return list(reversed(session.exec(statement).all()))


def recent_requests(session: Session, deployment_id: int | None, limit: int) -> list[RequestRecord]:
    """The newest finished requests, newest first."""
    statement = select(RequestRecord)
    if deployment_id is not None:
        statement = statement.where(RequestRecord.deployment_id == deployment_id)
    statement = statement.order_by(col(RequestRecord.id).desc()).limit(limit)
    return list(session.exec(statement).all())


def nodes(session: Session) -> list[NodeRow]:
    return list(session.exec(select(NodeRow).order_by(col(NodeRow.name))).all())


def gpus(session: Session) -> list[GpuRow]:
    statement = select(GpuRow).order_by(col(GpuRow.node_name), col(GpuRow.gpu_index))
    return list(session.exec(statement).all())


def gpu_samples_since(
    session: Session, since_unix_s: float, node_name: str | None, limit: int
) -> list[GpuSample]:
    """GPU readings at or after `since_unix_s`, oldest first (at most the newest `limit`)."""
    statement = select(GpuSample).where(GpuSample.time_unix_s >= since_unix_s)
    if node_name is not None:
        statement = statement.where(GpuSample.node_name == node_name)
    statement = statement.order_by(col(GpuSample.time_unix_s).desc(), col(GpuSample.id).desc())
    return list(reversed(session.exec(statement.limit(limit)).all()))
