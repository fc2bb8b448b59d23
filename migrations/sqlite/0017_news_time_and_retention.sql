-- News search walks items newest first by (effective_at, id) (see Store::search_news): one
-- index gives that order (and the window boundaries) without reading the rows.
CREATE INDEX news_items_time_id ON news_items(effective_at, id);
DROP INDEX news_items_time;
