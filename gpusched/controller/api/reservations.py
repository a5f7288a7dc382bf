"""``/v1/reservations``: advance reservations (``gcontrol create|update|delete|show
reservation``, ``ginfo -T``). Anyone may list them; only administrators change them."""

from __future__ import annotations

from typing import Any

from gpusched.controller.api.common import ApiContext
from gpusched.controller.http import Request, Router
from gpusched.core.reservations import ReservationError, check_name
from gpusched.db import reservations
from gpusched.db.notify import notify_in
from gpusched.errors import UsageError
from gpusched.messages.reservations import ReservationRequest


def _name(request: Request) -> str:
    name = request.params["name"]
    try:
        return check_name(name)
    except ReservationError as exc:
        raise UsageError(str(exc)) from None


class ReservationRoutes:
    """The reservation listing, and the administrators' changes to it."""

    def __init__(self, context: ApiContext) -> None:
        self.context = context

    def add_to(self, r: Router) -> None:
        """Register the reservation routes."""
        r.add("GET", "/v1/reservations", self.list)
        r.add("POST", "/v1/reservations", self.create)
        r.add("GET", "/v1/reservations/{name}", self.show)
        r.add("PATCH", "/v1/reservations/{name}", self.update)
        r.add("DELETE", "/v1/reservations/{name}", self.delete)

    def list(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Every reservation that is not over."""
        with self.context.sessions() as session:
            return 200, {"reservations": reservations.list_reservations(session)}

    def show(self, request: Request) -> tuple[int, dict[str, Any]]:
        """One reservation."""
        name = _name(request)
        with self.context.sessions() as session:
            return 200, reservations.list_reservations(session, name)[0]

    def create(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An administrator makes a reservation."""
        self.context.require_admin(request)
        asked = ReservationRequest.parse(request.body)
        with self.context.sessions() as session, session.begin():
            made = reservations.create_reservation(session, asked)
            notify_in(session, "sched")
        self._changed()
        return 201, made

    def update(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An administrator changes a reservation."""
        self.context.require_admin(request)
        name = _name(request)
        asked = ReservationRequest.parse(request.body)
        with self.context.sessions() as session, session.begin():
            changed = reservations.update_reservation(session, name, asked)
            notify_in(session, "sched")
        self._changed()
        return 200, changed

    def delete(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An administrator removes a reservation no job asks for."""
        self.context.require_admin(request)
        name = _name(request)
        with self.context.sessions() as session, session.begin():
            reservations.delete_reservation(session, name)
            notify_in(session, "sched")
        self._changed()
        return 200, {"name": name, "deleted": True}

    def _changed(self) -> None:
        # Here at once: this controller's next pass must not wait for the NOTIFY.
        self.context.events.admin_changed()
        self.context.events.wake_scheduler()
