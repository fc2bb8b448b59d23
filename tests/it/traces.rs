//! OpenTelemetry traces over OTLP/HTTP: a local OTLP receiver (an axum server decoding
//! `ExportTraceServiceRequest` protobuf bodies) gets the HTTP request spans and the
//! `execute_tool {tool}` spans of the GenAI conventions, one trace from the request that made
//! a call runnable (the freeze, or the grant of its approval) to the stored evidence.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use reqwest::StatusCode;
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt;

use crate::common::{Backend, TestTool, spawn};

type Spans = Arc<Mutex<Vec<Span>>>;

/// A local OTLP/HTTP receiver; returns its traces URL and the spans it got.
async fn receiver() -> (String, Spans) {
    let spans: Spans = Arc::default();
    let sink = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let sink = sink.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
                let mut sink = sink.lock().unwrap();
                for rs in request.resource_spans {
                    let service = rs
                        .resource
                        .iter()
                        .flat_map(|r| r.attributes.iter())
                        .find(|kv| kv.key == "service.name")
                        .and_then(|kv| string(kv.value.as_ref()?.value.as_ref()?));
                    assert_eq!(service.as_deref(), Some("mira"));
                    sink.extend(rs.scope_spans.into_iter().flat_map(|ss| ss.spans));
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1/traces"), spans)
}

fn string(v: &AnyValue) -> Option<String> {
    match v {
        AnyValue::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key == key).and_then(|kv| string(kv.value.as_ref()?.value.as_ref()?))
}

/// Flushes the provider and waits (10 s at most) until a span matching `pred` arrived.
async fn wait_span(
    provider: &opentelemetry_sdk::trace::SdkTracerProvider,
    spans: &Spans,
    what: &str,
    pred: impl Fn(&Span) -> bool,
) -> Span {
    for _ in 0..100 {
        let p = provider.clone();
        tokio::task::spawn_blocking(move || p.force_flush()).await.unwrap().unwrap();
        if let Some(s) = spans.lock().unwrap().iter().find(|s| pred(s)) {
            return s.clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let names: Vec<String> = spans.lock().unwrap().iter().map(|s| s.name.clone()).collect();
    panic!("no {what} span; got {names:?}");
}

async fn traces_follow_a_call_from_request_to_evidence(backend: Backend) {
    let (endpoint, spans) = receiver().await;
    let provider = mira::telemetry::provider(Some(&endpoint)).unwrap();
    let subscriber = tracing_subscriber::registry().with(mira::telemetry::layer(&provider));
    // One test per process (nextest): this test's process-wide subscriber.
    tracing::subscriber::set_global_default(subscriber).expect("no other subscriber in this process");

    let t = spawn(backend).await;
    let token = t.user("tracer").await;
    std::fs::write(t.workspace.join("notes.txt"), "traced\n").unwrap();
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "read notes.txt").await;

    // A read call runs at once: the freeze request is its parent. The caller's own
    // traceparent is continued.
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let resp = t
        .client
        .post(format!("{}/v1/runs/{run}/invocations", t.base))
        .bearer_auth(&token)
        .header("traceparent", format!("00-{caller_trace}-00f067aa0ba902b7-01"))
        .json(&json!({"turn_id": turn, "tool_id": "read_open", "tool_call_id": "call-read-1", "input": {"path": "notes.txt"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let frozen: serde_json::Value = resp.json().await.unwrap();
    let done = t.wait_final(&token, frozen["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");

    let freeze =
        wait_span(&provider, &spans, "freeze request", |s| s.name == "POST /v1/runs/{run_id}/invocations").await;
    assert_eq!(hex(&freeze.trace_id), caller_trace, "the caller's trace is continued");
    assert_eq!(attr(&freeze, "http.route").as_deref(), Some("/v1/runs/{run_id}/invocations"));
    assert_eq!(freeze.kind, opentelemetry_proto::tonic::trace::v1::span::SpanKind::Server as i32);
    let exec = wait_span(&provider, &spans, "execute_tool read_open", |s| s.name == "execute_tool read_open").await;
    assert_eq!(attr(&exec, "gen_ai.operation.name").as_deref(), Some("execute_tool"));
    assert_eq!(attr(&exec, "gen_ai.tool.name").as_deref(), Some("read_open"));
    assert_eq!(attr(&exec, "gen_ai.tool.call.id").as_deref(), Some("call-read-1"));
    assert_eq!(attr(&exec, "mira.invocation.id").as_deref(), frozen["invocation_id"].as_str());
    assert_eq!(hex(&exec.trace_id), caller_trace, "one trace from the request to the execution");
    assert_eq!(exec.parent_span_id, freeze.span_id, "the execution is a child of the freeze request");
    let stored =
        wait_span(&provider, &spans, "store_result", |s| s.name == "store_result" && s.parent_span_id == exec.span_id)
            .await;
    assert_eq!(stored.trace_id, exec.trace_id);
    assert!(attr(&exec, "gen_ai.tool.call.arguments").is_none(), "no inputs in spans");

    // A call that waits for approval: the grant request is the execution's parent.
    let tool = TestTool::new("traced_action", "a traced action that needs approval", true);
    t.app().registry.register(Arc::new(tool)).unwrap();
    let (turn, _) = t.turn(&token, &run, "traced action").await;
    let r = t.call(&token, &run, &turn, "traced_action", "call-act-1", json!({"value": "x"})).await;
    assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
    let grant = t
        .post(
            &format!("/v1/approvals/{}/grant", r.body["approval_id"].as_str().unwrap()),
            &token,
            json!({"tool_id": "traced_action", "tool_call_id": "call-act-1", "input_hash": r.body["input_hash"]}),
        )
        .await;
    assert_eq!(grant.status, StatusCode::OK, "{grant:?}");
    let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
    let granted =
        wait_span(&provider, &spans, "grant request", |s| s.name == "POST /v1/approvals/{approval_id}/grant").await;
    let exec =
        wait_span(&provider, &spans, "execute_tool traced_action", |s| s.name == "execute_tool traced_action").await;
    assert_eq!(exec.trace_id, granted.trace_id, "one trace from the grant to the execution");
    assert_eq!(exec.parent_span_id, granted.span_id);
    assert_eq!(attr(&exec, "gen_ai.tool.call.id").as_deref(), Some("call-act-1"));
    let _ = provider.shutdown();
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

both_backends!(traces_follow_a_call_from_request_to_evidence);
