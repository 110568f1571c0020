//! The admin REST surface of issue 3: groups, group grants, denies, PAT
//! rotation, the audit query and file flags, against the recording doubles.

use axum::body::Body;
use axum::http::{StatusCode, header};
use kg_proto::v1::*;
use serde_json::{Value, json};
use tower::ServiceExt as _;

use super::doubles::{GOOD, start_auth};
use super::{app, body_json, full_config, request};

/// Sends an authorized request with an optional JSON body.
async fn call(
    app: &axum::Router,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let builder = request(method, uri).header(header::AUTHORIZATION, format!("Bearer {GOOD}"));
    let request = match body {
        Some(body) => builder
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string())),
        None => builder.body(Body::empty()),
    }
    .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    (status, body_json(response).await)
}

fn message(body: &Value) -> &str {
    body["message"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn groups_are_created_listed_and_edited() {
    let auth = start_auth().await;
    let app = app(full_config(&auth).await);

    let (status, body) = call(
        &app,
        "POST",
        "/api/v1/groups",
        Some(json!({"name": "editors"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        body,
        json!({"id": "grp_1", "name": "editors", "memberIds": [], "createdAtMs": 5})
    );
    assert!(auth.recorded.saw(&CreateGroupRequest {
        name: "editors".into()
    }));

    let (status, body) = call(&app, "GET", "/api/v1/groups", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["groups"][0]["memberIds"], json!(["usr_a"]));

    let (status, body) = call(
        &app,
        "POST",
        "/api/v1/groups/grp_1/members",
        Some(json!({"principalId": "usr_b"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["memberIds"], json!(["usr_b"]));

    let (status, body) = call(&app, "DELETE", "/api/v1/groups/grp_1/members/usr_b", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["memberIds"], json!([]));
    assert!(auth.recorded.saw(&GroupMemberRequest {
        group_id: "grp_1".into(),
        principal_id: "usr_b".into()
    }));

    let (status, body) = call(&app, "POST", "/api/v1/groups", Some(json!({"title": "x"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["code"], "invalid_argument");

    // The same bearer guard as the rest of /api/v1.
    let response = app
        .oneshot(
            request("GET", "/api/v1/groups")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn grants_go_to_exactly_one_principal_or_group() {
    let auth = start_auth().await;
    let app = app(full_config(&auth).await);

    let (status, body) = call(
        &app,
        "POST",
        "/api/v1/grants",
        Some(json!({"groupId": "grp_1", "namespace": "demo", "permission": "write", "pathPrefix": "hr/"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"id": "grant_1", "principalId": null, "groupId": "grp_1", "namespace": "demo",
               "permission": "write", "pathPrefix": "hr/", "createdAtMs": 7})
    );
    assert!(auth.recorded.saw(&PutGrantRequest {
        principal_id: String::new(),
        namespace: "demo".into(),
        permission: Permission::Write as i32,
        path_prefix: "hr/".into(),
        group_id: "grp_1".into(),
    }));

    for bad in [
        json!({"groupId": "grp_1", "principalId": "usr_a", "namespace": "demo", "permission": "read"}),
        json!({"namespace": "demo", "permission": "read"}),
        json!({"principalId": " ", "namespace": "demo", "permission": "read"}),
    ] {
        let (status, body) = call(&app, "POST", "/api/v1/grants", Some(bad)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            message(&body).contains("exactly one of `principalId` and `groupId`"),
            "{body}"
        );
    }

    let (status, body) = call(&app, "GET", "/api/v1/grants?group=grp_1", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["grants"][0]["groupId"], "grp_1");
    assert!(auth.recorded.saw(&ListGrantsRequest {
        principal_id: String::new(),
        group_id: "grp_1".into()
    }));
    let (status, body) = call(&app, "GET", "/api/v1/grants?principal=usr_a", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["grants"][0]["principalId"], "usr_a");
    assert_eq!(body["grants"][0]["groupId"], json!(null));
    let (status, _) = call(&app, "GET", "/api/v1/grants", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(auth.recorded.saw(&ListGrantsRequest::default()));
    let (status, body) = call(&app, "GET", "/api/v1/grants?principal=a&group=b", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message(&body).contains("at most one"), "{body}");
}

#[tokio::test]
async fn denies_have_one_target_and_at_most_one_subject() {
    let auth = start_auth().await;
    let app = app(full_config(&auth).await);

    let (status, body) = call(
        &app,
        "POST",
        "/api/v1/denies",
        Some(json!({"namespace": "demo", "groupId": "grp_1", "pathPrefix": "hr"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        body,
        json!({"id": "deny_1", "namespace": "demo", "principalId": null, "groupId": "grp_1",
               "pathPrefix": "hr/", "fileId": null, "createdAtMs": 11})
    );
    // Everyone, one file.
    let (status, body) = call(
        &app,
        "POST",
        "/api/v1/denies",
        Some(json!({"namespace": "demo", "fileId": "f9"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        (body["fileId"].clone(), body["principalId"].clone()),
        (json!("f9"), json!(null))
    );
    assert!(auth.recorded.saw(&PutDenyRequest {
        namespace: "demo".into(),
        file_id: "f9".into(),
        ..Default::default()
    }));
    // An id no file has (a path passed for an id) withdraws nothing: refused, not stored.
    let (status, body) = call(
        &app,
        "POST",
        "/api/v1/denies",
        Some(json!({"namespace": "demo", "fileId": "eng/a.md"})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        message(&body).contains("no file has the id `eng/a.md`"),
        "{body}"
    );
    assert!(!auth.recorded.saw(&PutDenyRequest {
        namespace: "demo".into(),
        file_id: "eng/a.md".into(),
        ..Default::default()
    }));

    for (bad, needle) in [
        (
            json!({"namespace": "demo", "pathPrefix": "hr/", "fileId": "f1"}),
            "exactly one of `pathPrefix`",
        ),
        (json!({"namespace": "demo"}), "exactly one of `pathPrefix`"),
        (
            json!({"namespace": "demo", "pathPrefix": "/"}),
            "must name a folder",
        ),
        (json!({"namespace": "demo", "pathPrefix": "../x/"}), ""),
        (
            json!({"namespace": "demo", "principalId": "u", "groupId": "g", "fileId": "f1"}),
            "at most one of `principalId` and `groupId`",
        ),
        (json!({"namespace": "Not Valid", "fileId": "f1"}), ""),
    ] {
        let (status, body) = call(&app, "POST", "/api/v1/denies", Some(bad.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad} -> {body}");
        assert!(message(&body).contains(needle), "{bad} -> {body}");
    }

    let (status, body) = call(&app, "GET", "/api/v1/denies?namespace=demo", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["denies"][0]["pathPrefix"], "hr/");
    assert!(auth.recorded.saw(&ListDeniesRequest {
        namespace: "demo".into()
    }));

    let (status, body) = call(&app, "DELETE", "/api/v1/denies/deny_1", None).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"deleted": true})));
    let (status, body) = call(&app, "DELETE", "/api/v1/denies/deny_2", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(message(&body).contains("deny_2"));
}

#[tokio::test]
async fn rotating_a_pat_shows_the_new_token_once() {
    let auth = start_auth().await;
    let app = app(full_config(&auth).await);
    let (status, body) = call(&app, "POST", "/api/v1/pats/pat_1/rotate", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["token"], "kg_pat_rotated");
    assert_eq!(body["pat"]["id"], "pat_1");
    assert_eq!(body["pat"]["prefix"], "kg_pat_rota");
    let (status, body) = call(&app, "POST", "/api/v1/pats/pat_x/rotate", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["code"], "not_found");
}

#[tokio::test]
async fn the_audit_log_is_queried_with_filters_and_a_cursor() {
    let auth = start_auth().await;
    let app = app(full_config(&auth).await);
    {
        let mut audits = auth.recorded.audits.lock().unwrap();
        for (i, tool) in ["kg_search", "kg_open", "kg_search"].iter().enumerate() {
            audits.push(AuditEvent {
                id: format!("aud_{i}"),
                at_ms: 100 + i as i64,
                principal_id: "agt_test".into(),
                on_behalf_of: "usr_test".into(),
                tool: (*tool).into(),
                namespaces: vec!["demo".into()],
                outcome: "ok".into(),
                latency_us: 42,
                result_bytes: 7,
                request_id: format!("req_{i}"),
                transport: "http".into(),
                more_namespaces: 0,
                target: String::new(),
            });
        }
    }
    let (status, body) = call(
        &app,
        "GET",
        "/api/v1/audit?tool=kg_search&principal=agt_test&sinceMs=1&untilMs=999&limit=1",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"events": [{"id": "aud_0", "atMs": 100, "principalId": "agt_test", "onBehalfOf": "usr_test",
                           "tool": "kg_search", "namespaces": ["demo"], "moreNamespaces": 0, "outcome": "ok", "latencyUs": 42,
                           "resultBytes": 7, "requestId": "req_0", "transport": "http"}],
               "nextCursor": "1"})
    );
    assert!(auth.recorded.saw(&ListAuditRequest {
        principal_id: "agt_test".into(),
        tool: "kg_search".into(),
        since_ms: Some(1),
        until_ms: Some(999),
        limit: 1,
        cursor: String::new(),
    }));
    let (status, body) = call(
        &app,
        "GET",
        "/api/v1/audit?tool=kg_search&limit=1&cursor=1",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["events"][0]["id"], "aud_2");
    assert_eq!(body["nextCursor"], json!(null));

    let (status, body) = call(&app, "GET", "/api/v1/audit?sinceMs=5&untilMs=4", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message(&body).contains("sinceMs"));
    let (status, _) = call(&app, "GET", "/api/v1/audit?text=secret", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = call(&app, "GET", "/api/v1/audit?limit=-1", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn file_flags_and_deletion_go_through_the_file_id() {
    let auth = start_auth().await;
    let app = app(full_config(&auth).await);

    let (status, body) = call(
        &app,
        "PATCH",
        "/api/v1/namespaces/demo/files/docs/a.md",
        Some(json!({"hidden": true})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["file"]["fileId"], "fid:docs/a.md");
    assert_eq!(
        (
            body["file"]["hidden"].clone(),
            body["file"]["enabled"].clone()
        ),
        (json!(true), json!(true))
    );
    assert!(auth.recorded.saw(&SetFileFlagsRequest {
        namespace: "demo".into(),
        file_id: "fid:docs/a.md".into(),
        enabled: None,
        hidden: Some(true),
    }));

    let (status, body) = call(
        &app,
        "PATCH",
        "/api/v1/namespaces/demo/files/docs/a.md",
        Some(json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message(&body).contains("`enabled` and/or `hidden`"));
    let (status, _) = call(
        &app,
        "PATCH",
        "/api/v1/namespaces/demo/files/docs/a.md",
        Some(json!({"enabled": "no"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = call(
        &app,
        "PATCH",
        "/api/v1/namespaces/demo/files/missing.md",
        Some(json!({"enabled": false})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["code"], "not_found");

    let (status, body) = call(
        &app,
        "DELETE",
        "/api/v1/namespaces/demo/files/docs/a.md",
        None,
    )
    .await;
    assert_eq!((status, body), (StatusCode::OK, json!({"deleted": true})));
    assert!(auth.recorded.saw(&DeleteFileRequest {
        namespace: "demo".into(),
        file_id: "fid:docs/a.md".into(),
    }));
    let (status, _) = call(
        &app,
        "DELETE",
        "/api/v1/namespaces/demo/files/../etc/passwd",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// Every change through the admin API is in the audit log, made or refused, with its route,
/// the path it was made on and the namespaces it names; a read is not, and neither is a
/// request the bearer check turned away (there is no caller to record).
#[tokio::test]
async fn admin_changes_are_audited_made_or_refused() {
    let auth = start_auth().await;
    let app = app(full_config(&auth).await);

    let grant = json!({"groupId": "grp_1", "namespace": "demo", "permission": "write"});
    let (status, _) = call(&app, "POST", "/api/v1/grants", Some(grant)).await;
    assert_eq!(status, StatusCode::OK);
    let neither = json!({"namespace": "hr", "permission": "read"});
    let (status, _) = call(&app, "POST", "/api/v1/grants", Some(neither)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = call(&app, "DELETE", "/api/v1/namespaces/docs/files/a/b.md", None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, refused) = call(&app, "POST", "/api/v1/namespaces/docs/reindex", None).await;
    assert!(!status.is_success(), "{refused}");
    let (status, _) = call(&app, "GET", "/api/v1/grants", None).await;
    assert_eq!(status, StatusCode::OK);
    let anonymous = request("DELETE", "/api/v1/grants/grant_1")
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(anonymous).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    // Sent in the background, several at once: in any order, and no more than these four.
    let mut audits = auth.recorded.wait_audits(4).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        auth.recorded.audits().len(),
        4,
        "{:?}",
        auth.recorded.audits()
    );
    audits.sort_by(|a, b| a.target.cmp(&b.target).then(a.outcome.cmp(&b.outcome)));
    let seen: Vec<_> = audits
        .iter()
        .map(|e| {
            (
                e.tool.as_str(),
                e.target.as_str(),
                e.namespaces.clone(),
                e.outcome.as_str(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            (
                "admin:POST /api/v1/grants",
                "/api/v1/grants",
                vec!["hr".to_owned()],
                "invalid_argument"
            ),
            (
                "admin:POST /api/v1/grants",
                "/api/v1/grants",
                vec!["demo".to_owned()],
                "ok"
            ),
            (
                "admin:DELETE /api/v1/namespaces/{ns}/files/{*path}",
                "/api/v1/namespaces/docs/files/a/b.md",
                vec!["docs".to_owned()],
                "ok"
            ),
            (
                "admin:POST /api/v1/namespaces/{ns}/reindex",
                "/api/v1/namespaces/docs/reindex",
                vec!["docs".to_owned()],
                refused["code"].as_str().unwrap(),
            ),
        ]
    );
    for event in &audits {
        assert_eq!(
            (event.principal_id.as_str(), event.transport.as_str()),
            ("usr_test", "http")
        );
        assert!(
            event.latency_us >= 0 && event.result_bytes == 0,
            "{event:?}"
        );
    }
}
