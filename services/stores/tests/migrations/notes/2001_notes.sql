CREATE TABLE test_notes (
    id TEXT PRIMARY KEY,
    item_id TEXT NOT NULL REFERENCES test_items (id),
    body TEXT NOT NULL
);
