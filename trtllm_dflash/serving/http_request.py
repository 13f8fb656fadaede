# SPDX-License-Identifier: Apache-2.0
"""One HTTP request as the guard forwards it: the target in origin form, the end-to-end headers, a body
framed by Content-Length. Nothing the guard did not parse reaches Triton.

Why: the guard and Triton once read the same bytes differently. An absolute-form target
(``POST http://host/v2/models/m/generate``, RFC 9112 3.2.2) is routed by Triton to generate while a
guard that matched ``^/v2`` saw "not our endpoint"; ``Transfer-Encoding: CHUNKED`` was decoded by the
guard and not by Triton, which then read the chunk bytes as the next request. So h11 (the parser uvicorn
uses) reads each request once, this module turns it into a canonical one, and h11 writes that upstream:
whatever Triton routes on is what the guard checked.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import DFlashError
from .protocol import CLIENT_HEADER

# Hop-by-hop headers (RFC 9110 7.6.1) and the framing the guard redoes: never forwarded.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
                        "upgrade", "content-length", "expect", "host", "proxy-authorization", "proxy-authenticate"})
# absolute-form: scheme "://" authority [path-abempty] ["?" query]
_ABSOLUTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://([A-Za-z0-9\-._~!$&'()*+,;=:@\[\]]*)([/?][^#]*)?$")
# an origin-form path the guard and Triton cannot read differently: no percent-escapes (Triton's router
# matches the raw path; one that decoded them would route "%5F" where the guard saw no endpoint), no dot
# segments or empty segments, no fragment
_PATH = re.compile(r"^(/[A-Za-z0-9\-._~!$&'()*+,;=:@]+)*/?$")


@dataclass
class Request:
    method: str
    path: str                   # origin form, without the query
    query: str                  # "" or "?..."
    host: str
    headers: list[tuple[str, str]]  # end-to-end headers, lower-case names, in order

    @property
    def target(self) -> str:
        return self.path + self.query

    def header(self, name: str, default: str = "") -> str:
        return next((v for k, v in self.headers if k == name), default)


class BadTarget(Exception):
    def __init__(self, err: DFlashError):
        super().__init__(str(err))
        self.err = err


def origin_form(target: str) -> tuple[str, str, str]:
    """(path, query, authority or "") of a request target in origin or absolute form; BadTarget for
    authority-form (CONNECT), asterisk-form (``OPTIONS *``) and any path with escapes or dot segments."""
    authority = ""
    if not target.startswith("/"):
        m = _ABSOLUTE.match(target)
        if not m:
            raise BadTarget(DFlashError("request target", f"{target[:80]!r} is neither a path nor an absolute URL",
                                        "send METHOD /v2/... HTTP/1.1"))
        authority, target = m.group(1), m.group(2) or "/"
        if target.startswith("?"):
            target = "/" + target
    path, sep, query = target.partition("?")
    if "#" in target or not _PATH.match(path) or any(seg in (".", "..") for seg in path.split("/")):
        raise BadTarget(DFlashError("request target", f"{path[:80]!r} has escapes, dot or empty segments",
                                    "send the plain path, such as /v2/models/tensorrt_llm/generate"))
    return path, sep + query, authority


def from_h11(method: bytes, target: bytes, headers, drop: tuple[str, ...] = ()) -> Request:
    """A Request from h11's parse of a request head (h11 already refused bad syntax and framing).
    ``drop``: more header names never forwarded (ending with one of them, so a prefixed spelling such as
    ``triton-grpc-protocol-NAME`` goes too)."""
    path, query, authority = origin_form(target.decode("ascii", "replace"))
    pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
    connection = {t.strip().lower() for k, v in pairs if k == "connection" for t in v.split(",")}
    host = authority or next((v for k, v in pairs if k == "host"), "") or "localhost"
    kept = [(k, v) for k, v in pairs
            if k not in HOP_BY_HOP and k not in connection and not any(k.endswith(d) for d in drop if d)]
    return Request(method.decode("ascii"), path, query, host, kept)


def upstream_headers(req: Request, body_len: int, client: str = "") -> list[tuple[str, str]]:
    """The headers the guard sends upstream: Host, the end-to-end ones, Content-Length of the body, and the
    client's address as the guard saw it (``CLIENT_HEADER``; a client's own spelling of it is dropped)."""
    own = [(k, v) for k, v in req.headers if not k.endswith(CLIENT_HEADER)]
    return [("host", req.host), *own, *([(CLIENT_HEADER, client)] if client else []),
            ("content-length", str(body_len))]
