-- Four-eyes approvals and recorded cancel requests.
--
-- users.is_approver: the user may grant (or deny) another user's approval whose rule is
-- four-eyes. Admins may as well.
-- approvals.rule: the rule that applied when the call was frozen ('self_approval' or
-- 'four_eyes'), with the tool domain that demanded it. It never changes afterwards: a later
-- change of the deployment's four-eyes setting does not change what a stored approval needs.
-- invocations.cancel_requested_*: a cancel asked while the invocation ran (who, with which
-- token, when); the final status says what the request achieved.
ALTER TABLE users ADD COLUMN is_approver BIGINT NOT NULL DEFAULT 0;
ALTER TABLE approvals ADD COLUMN rule TEXT NOT NULL DEFAULT 'self_approval'
    CHECK (rule IN ('self_approval', 'four_eyes'));
ALTER TABLE approvals ADD COLUMN rule_domain TEXT;
CREATE INDEX approvals_rule_status ON approvals(rule, status, id);
ALTER TABLE invocations ADD COLUMN cancel_requested_at TEXT;
ALTER TABLE invocations ADD COLUMN cancel_requested_by TEXT;
ALTER TABLE invocations ADD COLUMN cancel_token_id TEXT;
