-- Which incarnation of each event stream the files service last published into: when the
-- stream was created, in Unix nanoseconds. A stream made again (NATS lost its state) has
-- another, and lost every change event it held, so the registry is replayed into it.
-- Portable DDL: accepted by both SQLite and PostgreSQL.
CREATE TABLE kg_bus_streams (
    stream TEXT PRIMARY KEY,
    created_ns BIGINT NOT NULL
);
