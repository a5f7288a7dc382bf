"""The controller's API as a client sees it: used by the CLIs, the agent and ``gpusched up``.

Kept apart from ``gpusched.cli`` so that the agent and other daemons reach the controller
without importing the command-line package, and kept light (``socket`` and ``json``
only) so that the user CLIs start fast.
"""

from gpusched.client.api import ApiClient

__all__ = ["ApiClient"]
