-- News search walks items newest first by (effective_at, id) (see Store::search_news): one
-- index gives that order (and the window boundaries) without reading the rows.
CREATE INDEX news_items_time_id ON news_items(effective_at, id);
DROP INDEX news_items_time;

-- Retention (src/retention.rs) looks for runs by age and removes a run's approvals and
-- terminal sessions by run id.
CREATE INDEX runs_created ON runs(created_at);
CREATE INDEX approvals_run ON approvals(run_id);
CREATE INDEX terminal_sessions_run ON terminal_sessions(run_id);
