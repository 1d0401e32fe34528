"""The JSON API under /api/v1: the pages' data, captures, continuous profiling, share links,
tokens and role bindings. Captures go through the same validation and stages as the CLI."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from pydantic import BaseModel, Field

from mldiag import limits
from mldiag.access import (
    ADMIN,
    ALL_RUNS,
    BROWSE,
    CAPTURE,
    PROFILE,
    REPORT,
    SHARE,
    SHARE_DEFAULT_S,
    Grant,
    Principal,
    check_role,
    create_link,
    create_token,
    share_path,
)
from mldiag.capture.requests import (
    TargetHeld,
    capture_request,
    continuous_request,
    register_push_target,
    remove_target,
)
from mldiag.console import lists, views
from mldiag.console.auth import console_of, require
from mldiag.console.pages import compared, get_session
from mldiag.errors import MldiagError

router = APIRouter(prefix="/api/v1", tags=["api"])

ADMIN_ONLY = Depends(require(ADMIN, project=True))
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:@+=,-]{0,254}$"


class CaptureBody(BaseModel):
    session: str = Field(pattern=_NAME, description="the new session's name")
    kind: Literal["on_demand", "on-demand", "snapshot"] = "on_demand"
    targets: list[str] = Field(default_factory=list, max_length=1024,
                               description="target hosts (default: all)")
    duration_s: float = Field(2.0, description=f"seconds, in (0, {limits.MAX_CAPTURE_S:g}]")
    host_tracer_level: int = Field(2, ge=0, le=3)
    device_tracer_level: int = Field(1, ge=0, le=2)
    python_tracer_level: int = Field(0, ge=0, le=1)


class ContinuousBody(BaseModel):
    action: Literal["start", "stop"]
    targets: list[str] = Field(default_factory=list, max_length=1024)
    window_s: float = Field(2.0, description=f"seconds, in [{limits.MIN_WINDOW_S:g}, "
                            f"{limits.MAX_WINDOW_S:g}]")
    max_bytes: int = Field(2 * 1024**3, description=f"bytes, in [{limits.MIN_RING_BYTES}, "
                           f"{limits.MAX_RING_BYTES}]")
    device_tracer_level: int = Field(1, ge=0, le=2)
    host_tracer_level: int = Field(2, ge=0, le=3)
    python_tracer_level: int = Field(0, ge=0, le=1)


class TargetBody(BaseModel):
    address: str = Field(max_length=300, pattern=r"^\S+:\d{1,5}$",
                         description="HOST:PORT of the workload's jax.profiler.start_server")
    host_name: str = Field("", pattern=r"^(|[A-Za-z0-9][A-Za-z0-9._:@+=,-]{0,254})$",
                           description="its name in profile file names (default: target- and "
                                       "8 random hex digits, never the address)")
    platform: Literal["", "tpu", "gpu", "cpu"] = ""


class ShareBody(BaseModel):
    anyone: bool = Field(False, description="no sign-in needed (admins only)")
    expires_s: float = Field(SHARE_DEFAULT_S, gt=0, le=30 * 86400)


class TokenBody(BaseModel):
    role: Literal["viewer", "analysis_viewer", "editor", "admin"]
    run: str = Field(ALL_RUNS, pattern=r"^(\*|[A-Za-z0-9][A-Za-z0-9._:@+=,-]{0,254})$")
    expires_s: float = Field(0.0, ge=0, le=366 * 86400, description="0: never")
    label: str = Field("", max_length=200)


class GrantBody(BaseModel):
    principal: str = Field(min_length=3, max_length=320, pattern=r"^[^\s]+@[^\s]+$")
    role: Literal["viewer", "analysis_viewer", "editor", "admin"]
    run: str = Field(ALL_RUNS, pattern=r"^(\*|[A-Za-z0-9][A-Za-z0-9._:@+=,-]{0,254})$")


class Accepted(BaseModel):
    message: str
    warnings: list[str] = []
    session: str | None = None
    request_id: str | None = None


def _run_or_404(request: Request, run: str) -> Any:
    record = console_of(request).plane.state.get_run(run)
    if record is None:
        raise HTTPException(404, f"no run {run!r}")
    return record


@router.get("/runs", description=lists.HELP)
def list_runs(request: Request, response: Response,
              principal: Principal = Depends(require(BROWSE))) -> list[dict[str, Any]]:
    """A page of the runs the caller may see (newest first): targets up/total, the newest
    session, the last verdict."""
    runs, next_cursor = views.runs_view(console_of(request), principal,
                                        lists.run_query(request))
    lists.link_next(request, response, lists.RUN_PARAMS, next_cursor)
    return runs


@router.get("/sessions", description=lists.HELP)
def list_all_sessions(request: Request, response: Response,
                      principal: Principal = Depends(require(BROWSE))) -> list[dict[str, Any]]:
    """A page of every run's sessions the caller may see (`run` narrows it to one run)."""
    rows, next_cursor = views.sessions_page(console_of(request), principal,
                                            lists.session_query(request))
    lists.link_next(request, response, (*lists.SESSION_PARAMS, "run"), next_cursor)
    return rows


@router.get("/runs/{run}")
def get_run(run: str, request: Request,
            principal: Principal = Depends(require(BROWSE))) -> dict[str, Any]:
    return views.run_view(console_of(request), principal, _run_or_404(request, run))


@router.get("/runs/{run}/metrics")
def list_metrics(run: str, request: Request, name: str | None = None,
                 last: int = Query(1000, ge=1, le=20_000),
                 principal: Principal = Depends(require(BROWSE))) -> list[dict[str, Any]]:
    """The newest `last` points the run's workload recorded (metrics.record), of one metric
    `name` or all, oldest first."""
    console = console_of(request)
    _run_or_404(request, run)
    return [p.to_dict() for p in console.plane.state.list_metrics(run, name, limit=last)]


@router.get("/runs/{run}/targets")
def list_targets(run: str, request: Request,
                 principal: Principal = Depends(require(PROFILE))) -> list[dict[str, Any]]:
    console = console_of(request)
    _run_or_404(request, run)
    return views.target_views(console, console.plane.state.list_targets(run))


@router.post("/runs/{run}/targets", status_code=201)
def post_target(run: str, body: TargetBody, request: Request,
                principal: Principal = Depends(require(CAPTURE))) -> dict[str, Any]:
    """Register a plain profiler server (a workload without the SDK that called
    jax.profiler.start_server) as a push target (editors). The address must pass the
    capture egress policy, and an address that another run holds needs rights on that run
    (403 otherwise); its status comes from one check that starts no profiling session."""
    console = console_of(request)
    _run_or_404(request, run)
    try:
        record, state = register_push_target(console.plane, run, body.address,
                                             host_name=body.host_name,
                                             platform=body.platform, now=console.clock(),
                                             principal=principal)
    except TargetHeld as e:
        raise HTTPException(403, str(e)) from e
    except MldiagError as e:
        raise HTTPException(400, str(e)) from e
    view = views.target_view(console, record, state)
    return {**view, "message": f"target {record.host} registered: {view['status']}"
            + (f" ({view['down_reason']})" if view["down_reason"] else "")}


@router.delete("/runs/{run}/targets/{host}")
def delete_target(run: str, host: str, request: Request,
                  principal: Principal = Depends(require(CAPTURE))) -> dict[str, Any]:
    """Forget a target of the run (editors)."""
    console = console_of(request)
    _run_or_404(request, run)
    try:
        gone = remove_target(console.plane, run, host)
    except MldiagError as e:
        raise HTTPException(404, str(e)) from e
    return {"run": run, "host": host, "deleted": gone,
            "message": f"target {host} of {run} deleted"}


@router.get("/runs/{run}/sessions", description=lists.HELP)
def list_sessions(run: str, request: Request, response: Response,
                  principal: Principal = Depends(require(BROWSE))) -> list[dict[str, Any]]:
    """A page of the run's sessions (newest first)."""
    console = console_of(request)
    _run_or_404(request, run)
    rows, next_cursor = views.sessions_page(console, principal,
                                            lists.session_query(request, run=run))
    lists.link_next(request, response, lists.SESSION_PARAMS, next_cursor)
    return rows


@router.get("/runs/{run}/sessions/{session}")
def session_detail(run: str, session: str, request: Request,
                   principal: Principal = Depends(require(BROWSE))) -> dict[str, Any]:
    console = console_of(request)
    return views.session_view(console, principal, get_session(console, run, session))


@router.get("/runs/{run}/compare")
def compare(run: str, a: str, b: str, request: Request,
            principal: Principal = Depends(require(REPORT))) -> dict[str, Any]:
    """diff.json of session `b` against session `a` of the run, from their stored
    snapshots: KPI, op, kernel, HLO, finding and config deltas and the ranked explanation."""
    return compared(console_of(request), run, a, b, principal)


class BaselineBody(BaseModel):
    session: str = Field("", pattern=r"^(|[A-Za-z0-9][A-Za-z0-9._:@+=,-]{0,254})$",
                         description="a REPORTED session of the run; empty to unpin")


@router.post("/runs/{run}/baseline")
def post_baseline(run: str, body: BaselineBody, request: Request,
                  principal: Principal = Depends(require(CAPTURE))) -> dict[str, Any]:
    """Pin the session the run's alert-triggered sessions are compared with (editors)."""
    console = console_of(request)
    _run_or_404(request, run)
    if body.session:
        s = get_session(console, run, body.session)
        if s.state != "REPORTED":
            raise HTTPException(409, f"session {s.key} is {s.state}: a baseline needs a report")
    record = console.plane.state.set_baseline(run, body.session)
    if record is None:
        raise HTTPException(404, f"no run {run!r}")
    return {"run": run, "baseline": record.baseline,
            "message": f"baseline of {run}: {record.baseline}" if record.baseline else
            f"baseline of {run} unpinned (the most recent OPTIMAL session)"}


@router.post("/runs/{run}/captures", status_code=202)
def post_capture(run: str, body: CaptureBody, request: Request,
                 principal: Principal = Depends(require(CAPTURE))) -> Accepted:
    """Capture a session now (on-demand, or a snapshot of the continuous ring)."""
    console = console_of(request)
    _run_or_404(request, run)
    try:
        message, warnings = capture_request(
            console.plane, run, body.session, kind=body.kind, hosts=body.targets,
            duration_s=body.duration_s, host_tracer_level=body.host_tracer_level,
            device_tracer_level=body.device_tracer_level,
            python_tracer_level=body.python_tracer_level)
    except limits.LimitExceeded as e:
        raise HTTPException(400, str(e)) from e
    except MldiagError as e:
        raise HTTPException(409, str(e)) from e
    console.plane.bus.publish(message)
    return Accepted(message=f"capture {run}/{body.session} requested on "
                    f"{len(message.targets)} target(s)", warnings=warnings,
                    session=body.session)


@router.post("/runs/{run}/continuous", status_code=202)
def post_continuous(run: str, body: ContinuousBody, request: Request,
                    principal: Principal = Depends(require(CAPTURE))) -> Accepted:
    """Start or stop continuous profiling on the run's targets."""
    console = console_of(request)
    _run_or_404(request, run)
    options = body.model_dump(exclude={"action", "targets"})
    try:
        message, warnings, _ = continuous_request(console.plane, run, body.action,
                                                  hosts=body.targets, options=options)
    except limits.LimitExceeded as e:
        raise HTTPException(400, str(e)) from e
    except MldiagError as e:
        raise HTTPException(409, str(e)) from e
    console.plane.bus.publish(message)
    return Accepted(message=f"continuous {body.action} requested on {len(message.targets)} "
                    "target(s)", warnings=warnings, request_id=message.request_id)


@router.post("/runs/{run}/sessions/{session}/share", status_code=201)
def post_share(run: str, session: str, body: ShareBody, request: Request,
               principal: Principal = Depends(require(SHARE))) -> dict[str, Any]:
    """A share link to this session; the URL is shown once."""
    console = console_of(request)
    record = get_session(console, run, session)
    if body.anyone and not principal.can(ADMIN, run):
        raise HTTPException(403, "only an admin may create a link that needs no sign-in")
    secret, link = create_link(console.access, run, session,
                               session_created_at=record.created_at, created_by=principal.name,
                               now=console.clock(), anyone=body.anyone,
                               expires_s=body.expires_s)
    return {"id": link.id, "url": console.settings.console_url + share_path(secret, run,
                                                                            session),
            "anyone": link.anyone, "expires_at": views._iso(link.expires_at)}


def _link_view(link: Any) -> dict[str, Any]:
    return {"id": link.id, "run": link.run, "session": link.session, "anyone": link.anyone,
            "created_by": link.created_by, "created_at": views._iso(link.created_at),
            "expires_at": views._iso(link.expires_at),
            "revoked_at": views._iso(link.revoked_at)}


@router.get("/share")
def list_share(request: Request, run: str | None = None, session: str | None = None,
               principal: Principal = Depends(require(SHARE))) -> list[dict[str, Any]]:
    """Links the caller may manage: their own, or every link of runs they administer."""
    console = console_of(request)
    return [_link_view(link) for link in console.access.list_links(run=run, session=session)
            if principal.can(ADMIN, link.run) or (
                link.created_by == principal.name and principal.can(SHARE, link.run))]


@router.delete("/share/{link_id}")
def revoke_share(link_id: str, request: Request,
                 principal: Principal = Depends(require(SHARE))) -> dict[str, Any]:
    """Revoke a link (its creator, or an admin of its run); effective at once."""
    console = console_of(request)
    link = next((li for li in console.access.list_links() if li.id == link_id), None)
    if link is None or not (principal.can(ADMIN, link.run) or (
            link.created_by == principal.name and principal.can(SHARE, link.run))):
        raise HTTPException(404, f"no share link {link_id!r} you may revoke")
    console.access.revoke_link(link_id, console.clock())
    return {"id": link_id, "revoked": True}


@router.get("/share/{link_id}/access")
def share_access(link_id: str, request: Request,
                 principal: Principal = ADMIN_ONLY) -> list[dict[str, Any]]:
    """A link's uses: one row per principal (or "anonymous"), client network and hour, with
    its count, first and last use and last path."""
    console = console_of(request)
    console.access_log.flush()
    return [{**e.to_dict(), "at": views._iso(e.at), "first_at": views._iso(e.first_at)}
            for e in console.access.list_access(link_id)]


@router.get("/tokens")
def list_tokens(request: Request,
                principal: Principal = ADMIN_ONLY) -> list[dict[str, Any]]:
    return [{k: v for k, v in t.to_dict().items() if k not in ("token_hash", "parent_hash")}
            for t in console_of(request).access.list_tokens() if t.kind != "login"]


@router.post("/tokens", status_code=201)
def post_token(body: TokenBody, request: Request,
               principal: Principal = ADMIN_ONLY) -> dict[str, Any]:
    """A new API token (shown once) with one role, on one run or all."""
    console = console_of(request)
    secret, record = create_token(console.access, role=body.role, run=body.run,
                                  now=console.clock(), expires_s=body.expires_s,
                                  label=body.label, created_by=principal.name)
    return {"id": record.id, "token": secret, "role": record.role, "run": record.run,
            "principal": record.principal_id}


@router.delete("/tokens/{token_id}")
def revoke_token(token_id: str, request: Request,
                 principal: Principal = ADMIN_ONLY) -> dict[str, Any]:
    console = console_of(request)
    if not console.access.revoke_token(token_id, console.clock()):
        raise HTTPException(404, f"no active token {token_id!r}")
    return {"id": token_id, "revoked": True}


@router.get("/grants")
def list_grants(request: Request,
                principal: Principal = ADMIN_ONLY) -> list[dict[str, Any]]:
    return [g.to_dict() for g in console_of(request).access.list_grants()]


@router.post("/grants", status_code=201)
def post_grant(body: GrantBody, request: Request,
               principal: Principal = ADMIN_ONLY) -> dict[str, Any]:
    console = console_of(request)
    grant = Grant(principal=body.principal, role=check_role(body.role), run=body.run,
                  created_at=console.clock(), created_by=principal.name)
    console.access.grant(grant)
    return grant.to_dict()


@router.delete("/grants")
def delete_grant(body: GrantBody, request: Request,
                 principal: Principal = ADMIN_ONLY) -> dict[str, Any]:
    if not console_of(request).access.revoke_grant(body.principal, body.role, body.run):
        raise HTTPException(404, "no such role binding")
    return {**body.model_dump(), "revoked": True}
