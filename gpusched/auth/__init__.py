"""Authentication for cluster mode: credentials that prove a caller's uid/gid (and, for
an agent, its node) over TCP, with two back-ends, MUNGE and a shared key.

``credential`` holds the interfaces and the header format, ``backends`` builds the
configured verifier (controllers) or credential source (clients, agents); ``admins``
decides who is an administrator.
"""
