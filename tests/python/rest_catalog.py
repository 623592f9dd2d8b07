#!/usr/bin/env python3
"""A small Iceberg REST catalog server for ketch's end-to-end tests.

ketch can archive topics through an Iceberg REST catalog (the Rust crate
iceberg-catalog-rest). The usual test servers for that (the Java reference
implementation, Polaris, Lakekeeper, ...) need Java or Docker, neither of which
this machine has, so the tests start this fixture instead. It implements the
part of the Iceberg REST catalog API (open-api/rest-catalog-open-api.yaml)
that iceberg-catalog-rest 0.10.1 and pyiceberg's RestCatalog use, on top of
pyiceberg's SqlCatalog on a SQLite file: the tables it serves are ordinary
Iceberg tables (metadata JSON, manifests and data files in the warehouse, one
row per table in the SQLite catalog), which pyiceberg's SqlCatalog opened on
the same SQLite file reads afterwards.

Usage:

    python3 tests/python/rest_catalog.py --uri sqlite:////abs/catalog.db \\
        --warehouse file:///abs/warehouse --catalog-name ketch \\
        [--host 127.0.0.1] [--port 0] [--prefix P] [--prop KEY=VALUE ...]
        [--vend KEY=VALUE ...]

Once listening it prints exactly one line, `rest catalog listening on
http://HOST:PORT`, to stdout (port 0 picks a free port) and serves until
SIGTERM or SIGINT. `--prop` passes FileIO settings (s3.endpoint,
s3.access-key-id, ...) to the SqlCatalog, which writes the table metadata
files; `--prefix` makes GET /v1/config hand clients a path prefix, so that
the catalog routes are served under /v1/{prefix}/; `--vend` puts a property
in every table response's "config", as a catalog that vends credentials
hands clients keys for a table's files. Requests are logged to
stderr only with --verbose (server errors always are).

Endpoints (all under /v1, the catalog ones after the optional prefix):

    GET    /config                               catalog configuration
    POST   /oauth/tokens                         a dummy token (no auth)
    GET    /namespaces[?parent=&pageToken=&pageSize=]
    POST   /namespaces                           create a namespace
    GET    /namespaces/{ns}                      load a namespace
    HEAD   /namespaces/{ns}                      namespace exists
    DELETE /namespaces/{ns}                      drop an empty namespace
    POST   /namespaces/{ns}/properties           update namespace properties
    GET    /namespaces/{ns}/tables[?pageToken=&pageSize=]
    POST   /namespaces/{ns}/tables               create (or stage) a table
    POST   /namespaces/{ns}/register             register a metadata file
    GET    /namespaces/{ns}/tables/{t}           load a table
    HEAD   /namespaces/{ns}/tables/{t}           table exists
    POST   /namespaces/{ns}/tables/{t}           commit updates to a table
    DELETE /namespaces/{ns}/tables/{t}[?purgeRequested=true]
    POST   /namespaces/{ns}/tables/{t}/metrics   metrics report (discarded)
    POST   /tables/rename                        rename a table

A multi-level namespace is one path segment, its levels joined with the
0x1F unit separator (URL-encoded %1F). Errors are the REST ErrorModel,
{"error": {"message", "type", "code"}}: 400 BadRequestException, 404
NoSuchNamespaceException / NoSuchTableException, 409 AlreadyExistsException /
NamespaceNotEmptyException / CommitFailedException, 406
UnsupportedOperationException, 500 for anything unexpected.

Commits are parsed with pyiceberg's CommitTableRequest and applied by
SqlCatalog.commit_table, which validates the requirements
(assert-table-uuid, assert-ref-snapshot-id, ...) against the current
metadata and swaps the metadata pointer only if nobody moved it meanwhile;
either failure is a 409 CommitFailedException, which clients retry after
reloading the table. The server also runs one catalog operation at a time
(SQLite and SqlCatalog are not meant for concurrent writers), so concurrent
commits from several clients serialize and the losers get that 409.

Not implemented: views, multi-table transactions (POST /transactions/commit),
credential vending beyond the fixed `--vend` properties (the
X-Iceberg-Access-Delegation header is ignored, and no storage-credentials
are sent), server-side scan planning, and
authentication (any token is accepted, none is required).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import ValidationError as PydanticValidationError
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import CreateTableRequest, RegisterTableRequest, TableResponse
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchIdentifierError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
    ValidationError as IcebergValidationError,
)
from pyiceberg.partitioning import PARTITION_FIELD_ID_START, UNPARTITIONED_PARTITION_SPEC
from pyiceberg.table import CommitTableRequest, Table, TableIdentifier
from pyiceberg.table.metadata import new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import AssertCreate
from pyiceberg.typedef import Identifier

# The separator of namespace levels in a path segment or `parent` parameter.
NAMESPACE_SEPARATOR = "\x1f"

Body = bytes | None
Reply = tuple[int, Body]


class CatalogError(Exception):
    """An error to send as an Iceberg REST ErrorModel."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


def bad_request(message: str) -> CatalogError:
    return CatalogError(HTTPStatus.BAD_REQUEST, "BadRequestException", message)


def not_found(message: str) -> CatalogError:
    return CatalogError(HTTPStatus.NOT_FOUND, "NotFoundException", message)


def as_catalog_error(error: Exception) -> CatalogError | None:
    """The REST error for an exception of pyiceberg's or of the request's,
    None for an unexpected one (a server error)."""
    if isinstance(error, CatalogError):
        return error
    mapping: list[tuple[type[Exception], int, str]] = [
        (NoSuchNamespaceError, HTTPStatus.NOT_FOUND, "NoSuchNamespaceException"),
        (NoSuchTableError, HTTPStatus.NOT_FOUND, "NoSuchTableException"),
        (NamespaceAlreadyExistsError, HTTPStatus.CONFLICT, "AlreadyExistsException"),
        (TableAlreadyExistsError, HTTPStatus.CONFLICT, "AlreadyExistsException"),
        (NamespaceNotEmptyError, HTTPStatus.CONFLICT, "NamespaceNotEmptyException"),
        (CommitFailedException, HTTPStatus.CONFLICT, "CommitFailedException"),
        (NotImplementedError, HTTPStatus.NOT_ACCEPTABLE, "UnsupportedOperationException"),
        # Malformed JSON or a body the models reject, an identifier or an
        # update pyiceberg refuses (a snapshot id already taken, a schema
        # that does not exist, ...).
        (PydanticValidationError, HTTPStatus.BAD_REQUEST, "BadRequestException"),
        (IcebergValidationError, HTTPStatus.BAD_REQUEST, "BadRequestException"),
        (NoSuchIdentifierError, HTTPStatus.BAD_REQUEST, "BadRequestException"),
        (ValueError, HTTPStatus.BAD_REQUEST, "BadRequestException"),
    ]
    for kind, status, name in mapping:
        if isinstance(error, kind):
            return CatalogError(status, name, str(error) or name)
    return None


def error_body(status: int, kind: str, message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": int(status)}}).encode()


def json_body(value: Any) -> bytes:
    return json.dumps(value).encode()


class _UncreatedTable:
    """Stands for the table a staged create brings into being when its
    transaction commits: SqlCatalog.commit_table asks its `table` argument
    for nothing but its name, and creates the table when it does not exist
    yet (the requirements then include assert-create)."""

    def __init__(self, identifier: Identifier):
        self._identifier = identifier

    def name(self) -> Identifier:
        return self._identifier


class RestCatalogBackend:
    """The REST operations on top of a SqlCatalog.

    Every public method takes the decoded request (path identifiers, query
    parameters, JSON body) and returns (HTTP status, response body), or
    raises; `as_catalog_error` turns what it raises into the REST error.
    """

    def __init__(self, catalog: SqlCatalog, prefix: str | None):
        self.catalog = catalog
        self.prefix = prefix
        # One catalog operation at a time: a commit reads the current
        # metadata, checks the requirements against it, writes the next
        # metadata file and swaps the pointer, which must not interleave
        # with another commit to the same table.
        self.lock = threading.Lock()

    # Configuration

    def config(self) -> Reply:
        # Both maps must be present: iceberg-catalog-rest's CatalogConfig has
        # no defaults for them. "endpoints" tells pyiceberg which routes exist
        # (iceberg-catalog-rest ignores it), written as the spec writes them,
        # "/v1/{prefix}/..." whether or not there is a prefix.
        routes = [
            ("GET", "namespaces"),
            ("POST", "namespaces"),
            ("GET", "namespaces/{namespace}"),
            ("HEAD", "namespaces/{namespace}"),
            ("DELETE", "namespaces/{namespace}"),
            ("POST", "namespaces/{namespace}/properties"),
            ("GET", "namespaces/{namespace}/tables"),
            ("POST", "namespaces/{namespace}/tables"),
            ("POST", "namespaces/{namespace}/register"),
            ("GET", "namespaces/{namespace}/tables/{table}"),
            ("HEAD", "namespaces/{namespace}/tables/{table}"),
            ("POST", "namespaces/{namespace}/tables/{table}"),
            ("DELETE", "namespaces/{namespace}/tables/{table}"),
            ("POST", "namespaces/{namespace}/tables/{table}/metrics"),
            ("POST", "tables/rename"),
        ]
        overrides = {"prefix": self.prefix} if self.prefix else {}
        return HTTPStatus.OK, json_body({
            "defaults": {},
            "overrides": overrides,
            "endpoints": [f"{method} /v1/{{prefix}}/{path}" for method, path in routes],
        })

    @staticmethod
    def token() -> Reply:
        # Clients configured with a credential exchange it here first; the
        # fixture does no authentication, so any token does.
        return HTTPStatus.OK, json_body({
            "access_token": "ketch-test-token",
            "token_type": "bearer",
            "expires_in": 3600,
            "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
        })

    # Namespaces

    def list_namespaces(self, query: dict[str, str]) -> Reply:
        parent = parse_namespace(query["parent"]) if query.get("parent") else ()
        with self.lock:
            # NoSuchNamespaceError if there is a parent and it does not exist.
            found = sorted(self.catalog.list_namespaces(parent))
        page, token = paginate(found, query)
        return HTTPStatus.OK, json_body(with_token({"namespaces": [list(ns) for ns in page]}, token))

    def create_namespace(self, body: Any) -> Reply:
        if not isinstance(body, dict):
            raise bad_request("expected a CreateNamespaceRequest object")
        namespace = namespace_levels(body.get("namespace"))
        properties = string_map(body.get("properties") or {}, "properties")
        with self.lock:
            self.catalog.create_namespace(namespace, properties)
            stored = self.catalog.load_namespace_properties(namespace)
        return HTTPStatus.OK, json_body({"namespace": list(namespace), "properties": stored})

    def load_namespace(self, namespace: Identifier) -> Reply:
        with self.lock:
            properties = self.catalog.load_namespace_properties(namespace)
        return HTTPStatus.OK, json_body({"namespace": list(namespace), "properties": properties})

    def namespace_exists(self, namespace: Identifier) -> Reply:
        with self.lock:
            exists = self.catalog.namespace_exists(namespace)
        if not exists:
            raise NoSuchNamespaceError(f"Namespace does not exist: {format_ns(namespace)}")
        return HTTPStatus.NO_CONTENT, None

    def drop_namespace(self, namespace: Identifier) -> Reply:
        with self.lock:
            self.catalog.drop_namespace(namespace)
        return HTTPStatus.NO_CONTENT, None

    def update_namespace_properties(self, namespace: Identifier, body: Any) -> Reply:
        if not isinstance(body, dict):
            raise bad_request("expected an UpdateNamespacePropertiesRequest object")
        removals = body.get("removals") or []
        if not isinstance(removals, list) or not all(isinstance(key, str) for key in removals):
            raise bad_request("removals must be a list of strings")
        updates = string_map(body.get("updates") or {}, "updates")
        with self.lock:
            summary = self.catalog.update_namespace_properties(namespace, set(removals), updates)
        return HTTPStatus.OK, json_body({
            "updated": sorted(summary.updated),
            "removed": sorted(summary.removed),
            "missing": sorted(summary.missing),
        })

    # Tables

    def list_tables(self, namespace: Identifier, query: dict[str, str]) -> Reply:
        with self.lock:
            # NoSuchNamespaceError if the namespace does not exist.
            found = sorted(self.catalog.list_tables(namespace))
        page, token = paginate(found, query)
        identifiers = [{"namespace": list(ident[:-1]), "name": ident[-1]} for ident in page]
        return HTTPStatus.OK, json_body(with_token({"identifiers": identifiers}, token))

    def create_table(self, namespace: Identifier, body: Any) -> Reply:
        request = CreateTableRequest.model_validate(normalize_create_table(body))
        identifier = (*namespace, table_name(request.name))
        partition_spec = request.partition_spec or UNPARTITIONED_PARTITION_SPEC
        sort_order = request.write_order or UNSORTED_SORT_ORDER
        # pyiceberg assigns fresh schema, partition field and sort order ids,
        # as the REST spec has servers do.
        with self.lock:
            if request.stage_create:
                return HTTPStatus.OK, self._stage_create(identifier, request)
            table = self.catalog.create_table(
                identifier,
                schema=request.table_schema,
                location=request.location,
                partition_spec=partition_spec,
                sort_order=sort_order,
                properties=dict(request.properties),
            )
        return HTTPStatus.OK, load_table_result(table.metadata_location, table)

    def _stage_create(self, identifier: Identifier, request: CreateTableRequest) -> bytes:
        """The metadata a staged create starts from, not stored anywhere: the
        client commits it (with assert-create) to create the table."""
        namespace = identifier[:-1]
        if not self.catalog.namespace_exists(namespace):
            raise NoSuchNamespaceError(f"Namespace does not exist: {format_ns(namespace)}")
        if self.catalog.table_exists(identifier):
            raise TableAlreadyExistsError(f"Table already exists: {format_ns(identifier)}")
        # The location SqlCatalog.create_table would pick.
        location = self.catalog._resolve_table_location(
            request.location, Catalog.namespace_to_string(namespace), identifier[-1]
        )
        metadata = new_table_metadata(
            schema=request.table_schema,
            partition_spec=request.partition_spec or UNPARTITIONED_PARTITION_SPEC,
            sort_order=request.write_order or UNSORTED_SORT_ORDER,
            location=location,
            properties=dict(request.properties),
        )
        response = TableResponse(metadata_location=None, metadata=metadata, config=dict(VENDED))
        return response.model_dump_json(exclude={"storage_credentials"}).encode()

    def register_table(self, namespace: Identifier, body: Any) -> Reply:
        if isinstance(body, dict):
            body = {"overwrite": False, **body}  # optional in the REST spec
        request = RegisterTableRequest.model_validate(body)
        identifier = (*namespace, table_name(request.name))
        with self.lock:
            table = self.catalog.register_table(identifier, request.metadata_location, request.overwrite)
        return HTTPStatus.OK, load_table_result(table.metadata_location, table)

    def load_table(self, identifier: Identifier) -> Reply:
        with self.lock:
            table = self.catalog.load_table(identifier)
        return HTTPStatus.OK, load_table_result(table.metadata_location, table)

    def table_exists(self, identifier: Identifier) -> Reply:
        with self.lock:
            exists = self.catalog.table_exists(identifier)
        if not exists:
            raise NoSuchTableError(f"Table does not exist: {format_ns(identifier)}")
        return HTTPStatus.NO_CONTENT, None

    def commit_table(self, identifier: Identifier, body: Any) -> Reply:
        if not isinstance(body, dict):
            raise bad_request("expected a CommitTableRequest object")
        # The identifier is optional in the body of a single-table commit:
        # the path names the table.
        path_identifier = {"namespace": list(identifier[:-1]), "name": identifier[-1]}
        request = CommitTableRequest.model_validate({"identifier": path_identifier, **body})
        named = (*request.identifier.namespace.root, request.identifier.name)
        if named != identifier:
            raise bad_request(f"the body names table {format_ns(named)}, the path {format_ns(identifier)}")
        with self.lock:
            table: Table | _UncreatedTable
            try:
                table = self.catalog.load_table(identifier)
            except NoSuchTableError:
                # Only the commit of a staged create may make the table.
                if not any(isinstance(r, AssertCreate) for r in request.requirements):
                    raise
                table = _UncreatedTable(identifier)
            # Validates the requirements (CommitFailedException when one
            # does not hold), applies the updates with pyiceberg's metadata
            # builder, writes the next metadata file and moves the pointer
            # only if it still is where it was (CommitFailedException if not).
            response = self.catalog.commit_table(table, request.requirements, request.updates)  # type: ignore[arg-type]
        return HTTPStatus.OK, response.model_dump_json().encode()

    def drop_table(self, identifier: Identifier, query: dict[str, str]) -> Reply:
        purge = query.get("purgeRequested", "false").lower() == "true"
        with self.lock:
            if purge:
                self.catalog.purge_table(identifier)
            else:
                self.catalog.drop_table(identifier)
        return HTTPStatus.NO_CONTENT, None

    def rename_table(self, body: Any) -> Reply:
        if not isinstance(body, dict):
            raise bad_request("expected a RenameTableRequest object")
        source = TableIdentifier.model_validate(body.get("source"))
        destination = TableIdentifier.model_validate(body.get("destination"))
        src = (*namespace_levels(source.namespace.root), table_name(source.name))
        dst = (*namespace_levels(destination.namespace.root), table_name(destination.name))
        with self.lock:
            self.catalog.rename_table(src, dst)
        return HTTPStatus.NO_CONTENT, None

    @staticmethod
    def report_metrics() -> Reply:
        # Clients may send scan and commit reports; the fixture has no use
        # for them.
        return HTTPStatus.NO_CONTENT, None


# The `--vend` properties: every table response's "config".
VENDED: dict[str, str] = {}


def load_table_result(metadata_location: str, table: Table) -> bytes:
    """A LoadTableResult: metadata-location, metadata and the `--vend`
    properties as its config (storage-credentials left out)."""
    response = TableResponse(metadata_location=metadata_location, metadata=table.metadata, config=dict(VENDED))
    return response.model_dump_json(exclude={"storage_credentials"}).encode()


def normalize_create_table(body: Any) -> dict[str, Any]:
    """A CreateTableRequest as pyiceberg's model accepts it.

    The REST spec makes location, partition-spec and write-order optional
    and a partition field's field-id too (iceberg-catalog-rest leaves all of
    them out when unset); pyiceberg's model requires them. Missing partition
    field ids get the ones a new table would assign anyway (fresh ids are
    assigned on create in any case).
    """
    if not isinstance(body, dict):
        raise bad_request("expected a CreateTableRequest object")
    body = {"location": None, "partition-spec": None, "write-order": None, **body}
    spec = body["partition-spec"]
    if isinstance(spec, dict) and isinstance(spec.get("fields"), list):
        fields = [dict(f) if isinstance(f, dict) else f for f in spec["fields"]]
        taken = [f["field-id"] for f in fields if isinstance(f, dict) and f.get("field-id") is not None]
        next_id = max(taken, default=PARTITION_FIELD_ID_START - 1) + 1
        for field in fields:
            if isinstance(field, dict) and field.get("field-id") is None:
                field["field-id"] = next_id
                next_id += 1
        body["partition-spec"] = {**spec, "fields": fields}
    return body


def namespace_levels(levels: Any) -> Identifier:
    """A namespace identifier, validated. SqlCatalog stores a namespace as
    its levels joined with '.', so a level may not contain one."""
    if not isinstance(levels, (list, tuple)) or not levels:
        raise bad_request("a namespace is a non-empty list of strings")
    for level in levels:
        if not isinstance(level, str) or not level:
            raise bad_request("a namespace level must be a non-empty string")
        if "." in level:
            raise bad_request(f"namespace level {level!r} contains '.', which the SQL catalog cannot store")
    return tuple(levels)


def parse_namespace(segment: str) -> Identifier:
    return namespace_levels(segment.split(NAMESPACE_SEPARATOR))


def table_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise bad_request("a table name must be a non-empty string")
    return name


def string_map(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise bad_request(f"{what} must map strings to strings")
    return value


def format_ns(identifier: Identifier) -> str:
    return ".".join(identifier)


def paginate(items: list[Any], query: dict[str, str]) -> tuple[list[Any], str | None]:
    """The page of `items` that pageToken (an offset) and pageSize ask for,
    and the token of the next page if there is one. Without pageSize the
    page runs to the end."""
    try:
        start = int(query.get("pageToken") or 0)
        size = int(query["pageSize"]) if query.get("pageSize") else None
    except ValueError:
        raise bad_request("pageToken and pageSize must be integers") from None
    if start < 0 or (size is not None and size <= 0):
        raise bad_request("pageToken must be >= 0 and pageSize > 0")
    end = len(items) if size is None else min(start + size, len(items))
    return items[start:end], (str(end) if end < len(items) else None)


def with_token(response: dict[str, Any], token: str | None) -> dict[str, Any]:
    # iceberg-catalog-rest and pyiceberg both read a missing
    # next-page-token as the last page.
    if token is not None:
        response["next-page-token"] = token
    return response


class CatalogRequestHandler(BaseHTTPRequestHandler):
    """Routes HTTP requests to the backend and writes its replies."""

    # Keep-alive, as reqwest and requests expect; every response has a
    # Content-Length (or is a 204 / a HEAD reply, which have no body).
    protocol_version = "HTTP/1.1"
    server: CatalogHTTPServer

    def do_GET(self) -> None:
        self._handle("GET")

    def do_HEAD(self) -> None:
        self._handle("HEAD")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def _handle(self, method: str) -> None:
        try:
            # Read the body first, whatever happens next, so that the
            # connection stays in step with the client.
            raw_body = self._read_body()
            status, body = self._route(method, raw_body)
        except Exception as error:  # noqa: BLE001 - every failure becomes a REST error
            known = as_catalog_error(error)
            if known is None:
                traceback.print_exc(file=sys.stderr)
                known = CatalogError(HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError", repr(error))
            status, body = known.status, error_body(known.status, known.kind, known.message)
        self._reply(method, status, body)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    # Trailer fields, up to the blank line.
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _route(self, method: str, raw_body: bytes) -> Reply:
        backend = self.server.backend
        url = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(url.query, keep_blank_values=True).items()}
        # Split before decoding: a level or table name may contain an
        # encoded '/'.
        raw_parts = url.path.split("/")
        if raw_parts[:2] != ["", "v1"]:
            raise not_found(f"no route for {method} {url.path}")
        parts = [unquote(part) for part in raw_parts[2:]]

        def body() -> Any:
            try:
                return json.loads(raw_body or b"null")
            except ValueError as error:
                raise bad_request(f"the request body is not JSON: {error}") from None

        def wrong_method() -> CatalogError:
            return CatalogError(HTTPStatus.METHOD_NOT_ALLOWED, "BadRequestException", f"{method} is not allowed on {url.path}")

        # Unprefixed routes.
        if parts == ["config"]:
            if method != "GET":
                raise wrong_method()
            return backend.config()
        if parts == ["oauth", "tokens"]:
            if method != "POST":
                raise wrong_method()
            return backend.token()

        if backend.prefix:
            if not parts or parts[0] != backend.prefix:
                raise not_found(f"no route for {method} {url.path} (the prefix is {backend.prefix!r})")
            parts = parts[1:]

        match parts:
            case ["namespaces"]:
                if method == "GET":
                    return backend.list_namespaces(query)
                if method == "POST":
                    return backend.create_namespace(body())
            case ["namespaces", ns]:
                namespace = parse_namespace(ns)
                if method == "GET":
                    return backend.load_namespace(namespace)
                if method == "HEAD":
                    return backend.namespace_exists(namespace)
                if method == "DELETE":
                    return backend.drop_namespace(namespace)
            case ["namespaces", ns, "properties"]:
                if method == "POST":
                    return backend.update_namespace_properties(parse_namespace(ns), body())
            case ["namespaces", ns, "tables"]:
                namespace = parse_namespace(ns)
                if method == "GET":
                    return backend.list_tables(namespace, query)
                if method == "POST":
                    return backend.create_table(namespace, body())
            case ["namespaces", ns, "register"]:
                if method == "POST":
                    return backend.register_table(parse_namespace(ns), body())
            case ["namespaces", ns, "tables", name]:
                identifier = (*parse_namespace(ns), table_name(name))
                if method == "GET":
                    return backend.load_table(identifier)
                if method == "HEAD":
                    return backend.table_exists(identifier)
                if method == "POST":
                    return backend.commit_table(identifier, body())
                if method == "DELETE":
                    return backend.drop_table(identifier, query)
            case ["namespaces", ns, "tables", name, "metrics"]:
                if method == "POST":
                    return backend.report_metrics()
            case ["tables", "rename"]:
                if method == "POST":
                    return backend.rename_table(body())
            case _:
                raise not_found(f"no route for {method} {url.path}")
        raise wrong_method()

    def _reply(self, method: str, status: int, body: Body) -> None:
        self.send_response(status)
        if status == HTTPStatus.NO_CONTENT:
            self.end_headers()
            return
        payload = body or b""
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(0 if method == "HEAD" else len(payload)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        if self.server.verbose:
            super().log_message(format, *args)

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002
        # Malformed requests and timeouts: always worth seeing.
        super().log_message(format, *args)


class CatalogHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], backend: RestCatalogBackend, verbose: bool):
        self.backend = backend
        self.verbose = verbose
        super().__init__(address, CatalogRequestHandler)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="An Iceberg REST catalog backed by pyiceberg's SqlCatalog (a test fixture).")
    parser.add_argument("--uri", required=True, help="SQLAlchemy URI of the catalog database, e.g. sqlite:////abs/catalog.db")
    parser.add_argument("--warehouse", required=True, help="where new tables go, e.g. file:///abs/warehouse")
    parser.add_argument("--catalog-name", required=True, help="the catalog name the SQL catalog rows carry")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--prefix", default=None, help="a path prefix to hand clients in /v1/config")
    parser.add_argument(
        "--prop",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a property for the SqlCatalog and its FileIO (s3.endpoint, ...); repeatable",
    )
    parser.add_argument(
        "--vend",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a property for every table response's config (s3.access-key-id, ...); repeatable",
    )
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)
    if args.prefix is not None and (not args.prefix or "/" in args.prefix):
        parser.error("--prefix must be one non-empty path segment")
    for option, props in (("--prop", args.prop), ("--vend", args.vend)):
        for prop in props:
            if "=" not in prop:
                parser.error(f"{option} {prop!r} is not KEY=VALUE")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    properties = dict(prop.split("=", 1) for prop in args.prop)
    VENDED.update(prop.split("=", 1) for prop in args.vend)
    properties.update({"uri": args.uri, "warehouse": args.warehouse})
    if args.uri.startswith("sqlite:///"):
        # sqlite:////abs/x.db: SQLite creates the file, not its directory.
        path = args.uri[len("sqlite:///"):].split("?", 1)[0]
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    catalog = SqlCatalog(args.catalog_name, **properties)
    backend = RestCatalogBackend(catalog, args.prefix)
    server = CatalogHTTPServer((args.host, args.port), backend, args.verbose)

    def stop(signum: int, frame: Any) -> None:
        # shutdown() waits for serve_forever() to return, which runs on this
        # (the main) thread: ask from another one.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    host, port = server.server_address[:2]
    print(f"rest catalog listening on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        # Let an operation in flight finish (no half-done commit), and keep
        # the lock: request threads still running are daemons and die with
        # the process.
        backend.lock.acquire(timeout=30)
        catalog.engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
