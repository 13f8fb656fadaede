# SPDX-License-Identifier: Apache-2.0
"""Triton's APIs that no client of our model needs and that must not be open to one, by name.

System/CUDA shared memory (registering a region by key is a step of CVE-2025-23320/23334's chain),
loading and unloading models, tracing and log settings. Triton 2.51 closes them behind a header
(``--http-restricted-api`` / ``--grpc-restricted-protocol``) whose key it reads only from its command line,
which any local user can read in /proc; and its gRPC front end also accepts the key under a prefixed
metadata name (``triton-grpc-protocol-<header>``). So the guards refuse these APIs by path and method
themselves, whatever headers come with them: the key in argv opens nothing through a guard.
"""
from __future__ import annotations

import re

RESTRICTED_APIS = "shared-memory,model-repository,trace,logging"   # Triton's names, for its own flags
ADMIN_HEADER = "dflash-admin-key"

HTTP_PATHS = re.compile(r"^/v2/(?:systemsharedmemory|cudasharedmemory|repository|trace|logging)(?:/|$)"
                        r"|^/v2/models/[^/]+(?:/versions/[^/]+)?/trace(?:/|$)")
GRPC_METHODS = frozenset("/inference.GRPCInferenceService/" + name for name in (
    "SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister",
    "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload", "TraceSetting", "LogSettings"))
WHY = ("This API is restricted (shared memory, model repository, trace, logging): dflash-serve does not "
       "serve it to clients")
FIX = "run tritonserver yourself (without dflash-serve) to use it"


def is_admin_header(name: str) -> bool:
    """A header / metadata name that carries the admin key under any spelling Triton accepts."""
    return name.lower().endswith(ADMIN_HEADER)
