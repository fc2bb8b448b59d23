//! The News Hub: sources collected on a schedule ([`collector`]), feed documents turned
//! into items ([`feed`]), the query language ([`query`]) and the `news_search` tool
//! ([`tool`]), which reads only what was collected — never the live web.

pub mod collector;
pub mod feed;
pub use crate::store::news_query as query;
pub mod tool;
