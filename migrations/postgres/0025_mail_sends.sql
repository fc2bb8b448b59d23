-- The Mail tools' send ledger (src/store/mail.rs): one row per Message-ID that mail_send
-- started to send, so a message is never sent twice — a second execution of the same frozen
-- message finds the row: `sent` answers with the first send's result, `sending`/`unknown`
-- (the outcome of the first attempt is not known) is `outcome_unknown` without sending.
-- A definitive refusal by the server (nothing was sent) removes the row.
CREATE TABLE mail_sends (
    message_id TEXT PRIMARY KEY,
    invocation_id TEXT NOT NULL,
    connection_id TEXT NOT NULL,
    message_sha256 TEXT NOT NULL,
    state TEXT NOT NULL,
    reply TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
