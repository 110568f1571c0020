//! The auth service's SQL runs unchanged on SQLite and PostgreSQL: the same
//! scenario against both real backends.
use std::collections::BTreeSet;

use kg_auth::{AuthService, DenyTarget, Subject};
use kg_common::ErrorCode;
use kg_common::ErrorExt as _;
use kg_common::caller::{ContextSigner, ContextVerifier, now_ms};
use kg_proto::v1::{
    AccessFilter, AuditEvent, CallerContext, ListAuditRequest, Permission, PrincipalKind,
};
use kg_stores::embedded::{EmbeddedPostgres, find_venv};
use kg_stores::sql::SqlStore;

const PAT_KEY: &[u8; 32] = b"0123456789abcdef0123456789abcdef";

/// The decoded context minted for `token`.
async fn context(auth: &AuthService, token: &str) -> CallerContext {
    auth.authorize(token, "kg_search", &[], "r")
        .await
        .unwrap()
        .decoded
        .unwrap()
}

/// The filter of `namespace` in a context.
fn filter<'a>(ctx: &'a CallerContext, namespace: &str) -> &'a AccessFilter {
    ctx.access
        .iter()
        .find(|a| a.namespace == namespace)
        .unwrap_or_else(|| panic!("no access to {namespace}: {:?}", ctx.access))
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn principal(id: &str) -> Subject {
    Subject::Principal(id.to_owned())
}

async fn scenario(sql: SqlStore) {
    let signer = ContextSigner::generate();
    let verifier = ContextVerifier::new(vec![signer.public_key()]);
    let auth = AuthService::new(sql.clone(), signer, PAT_KEY.to_vec(), "dep-1".into())
        .await
        .unwrap();

    // Bootstraps run at once (a Job retried, one per auth pod) make one admin between them.
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let auth = auth.clone();
            tokio::spawn(async move { auth.bootstrap_admin().await.unwrap() })
        })
        .collect();
    let mut tokens = Vec::new();
    for racer in racers {
        tokens.extend(racer.await.unwrap());
    }
    assert_eq!(
        tokens.len(),
        1,
        "racing bootstraps made {} admins",
        tokens.len()
    );
    let admin_token = tokens.remove(0);
    assert!(
        auth.bootstrap_admin().await.unwrap().is_none(),
        "admin is created once"
    );
    let admin = auth
        .authorize(&admin_token, "admin", &[], "r1")
        .await
        .unwrap();
    let admin_ctx = verifier
        .verify(admin.context.as_ref().unwrap(), now_ms())
        .unwrap();
    assert!(admin_ctx.is_admin);

    auth.create_namespace(&admin_ctx, "handbook", "docs")
        .await
        .unwrap();
    auth.create_namespace(&admin_ctx, "finance", "")
        .await
        .unwrap();
    let dup = auth
        .create_namespace(&admin_ctx, "handbook", "")
        .await
        .unwrap_err();
    assert_eq!(dup.code(), ErrorCode::AlreadyExists);

    let user = auth
        .create_principal(&admin_ctx, "ada", PrincipalKind::User, "", false)
        .await
        .unwrap();
    let agent = auth
        .create_principal(&admin_ctx, "bot", PrincipalKind::Agent, &user.id, false)
        .await
        .unwrap();
    auth.put_grant(
        &admin_ctx,
        &principal(&user.id),
        "handbook",
        Permission::Read,
        "guides/",
    )
    .await
    .unwrap();
    auth.put_grant(
        &admin_ctx,
        &principal(&agent.id),
        "handbook",
        Permission::Read,
        "",
    )
    .await
    .unwrap();
    auth.put_grant(
        &admin_ctx,
        &principal(&agent.id),
        "finance",
        Permission::Read,
        "",
    )
    .await
    .unwrap();
    let (user_token, user_pat) = auth
        .create_pat(&admin_ctx, &user.id, "laptop", None)
        .await
        .unwrap();
    let (agent_token, _) = auth
        .create_pat(&admin_ctx, &agent.id, "bot", None)
        .await
        .unwrap();

    // The user reads only its folder; it is not an admin; readers never see hidden files.
    let ctx = context(&auth, &user_token).await;
    assert!(!ctx.is_admin);
    assert_eq!(ctx.access.len(), 1);
    assert_eq!(ctx.access[0].allow_prefixes, strings(&["guides/"]));
    assert!(ctx.access[0].visible_only);
    let denied = auth.create_namespace(&ctx, "x", "").await.unwrap_err();
    assert_eq!(denied.code(), ErrorCode::PermissionDenied);

    // The agent reads what both read: handbook/guides only, not finance.
    let ctx = context(&auth, &agent_token).await;
    assert_eq!(ctx.access.len(), 1);
    assert_eq!(ctx.access[0].namespace, "handbook");
    assert_eq!(ctx.access[0].allow_prefixes, strings(&["guides/"]));
    let err = auth
        .authorize(&agent_token, "kg_search", &["finance".to_owned()], "r4")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
    assert!(err.to_string().contains("finance"));

    // ---- groups and group grants -------------------------------------------
    let bea = auth
        .create_principal(&admin_ctx, "bea", PrincipalKind::User, "", false)
        .await
        .unwrap();
    let wes = auth
        .create_principal(&admin_ctx, "wes", PrincipalKind::User, "", false)
        .await
        .unwrap();
    let readers = auth.create_group(&admin_ctx, "readers").await.unwrap();
    let err = auth.create_group(&admin_ctx, "readers").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::AlreadyExists);
    let err = auth.create_group(&ctx, "not-admin").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
    // Names that pass for others, and the role only admins hold, are refused.
    for (bad, why) in [
        ("readers ", "white space at either end"),
        ("read\u{200B}ers", "invisible"),
        ("\u{202E}sredaer", "invisible"),
        ("role:admin", "the role every admin holds"),
    ] {
        let err = auth.create_group(&admin_ctx, bad).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{bad:?}");
        assert!(err.to_string().contains(why), "{bad:?}: {err}");
    }
    // 150 characters of two bytes each are 150 characters, within the 200 allowed.
    auth.create_group(&admin_ctx, &"é".repeat(150))
        .await
        .unwrap();
    let err = auth
        .create_namespace(&admin_ctx, "described", &"x".repeat(1_001))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let err = auth
        .create_namespace(&admin_ctx, "described", "red \u{1b}[31m text")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    for (group, member) in [
        (&readers.id, "usr_nobody"),
        (&"grp_nothing".to_owned(), &bea.id),
    ] {
        let err = auth
            .add_group_member(&admin_ctx, group, member)
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound, "{group} {member}");
    }
    auth.add_group_member(&admin_ctx, &readers.id, &bea.id)
        .await
        .unwrap();
    let group = auth
        .add_group_member(&admin_ctx, &readers.id, &bea.id)
        .await
        .unwrap();
    assert_eq!(
        group.member_ids,
        vec![bea.id.clone()],
        "adding twice is a no-op"
    );
    let err = auth
        .put_grant(
            &admin_ctx,
            &Subject::Everyone,
            "handbook",
            Permission::Read,
            "",
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let err = auth
        .put_grant(
            &admin_ctx,
            &Subject::Group("grp_nothing".into()),
            "handbook",
            Permission::Read,
            "",
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    let group_grant = auth
        .put_grant(
            &admin_ctx,
            &Subject::Group(readers.id.clone()),
            "handbook",
            Permission::Read,
            "",
        )
        .await
        .unwrap();
    assert_eq!(group_grant.group_id, readers.id);
    assert!(group_grant.principal_id.is_empty());
    // The same prefix for a principal and for a group are two grants.
    auth.put_grant(
        &admin_ctx,
        &principal(&bea.id),
        "handbook",
        Permission::Read,
        "",
    )
    .await
    .unwrap();
    // Re-granting updates in place.
    let again = auth
        .put_grant(
            &admin_ctx,
            &Subject::Group(readers.id.clone()),
            "handbook",
            Permission::Read,
            "/",
        )
        .await
        .unwrap();
    assert_eq!(again.id, group_grant.id);
    let listed = auth
        .list_grants(&admin_ctx, &Subject::Group(readers.id.clone()))
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    auth.delete_grant(
        &admin_ctx,
        &auth
            .list_grants(&admin_ctx, &principal(&bea.id))
            .await
            .unwrap()[0]
            .id,
    )
    .await
    .unwrap();
    assert!(
        auth.list_grants(&admin_ctx, &Subject::Everyone)
            .await
            .unwrap()
            .iter()
            .any(|g| g.group_id == readers.id)
    );
    auth.put_grant(
        &admin_ctx,
        &principal(&wes.id),
        "handbook",
        Permission::Write,
        "",
    )
    .await
    .unwrap();
    let (bea_token, bea_pat) = auth
        .create_pat(&admin_ctx, &bea.id, "bea", None)
        .await
        .unwrap();
    let (wes_token, _) = auth
        .create_pat(&admin_ctx, &wes.id, "wes", None)
        .await
        .unwrap();
    // bea reads through the group only; wes writes and so sees hidden files.
    let ctx = context(&auth, &bea_token).await;
    let f = filter(&ctx, "handbook");
    assert_eq!(f.allow_prefixes, vec![String::new()]);
    assert_eq!(f.permission, Permission::Read as i32);
    assert!(f.visible_only);
    let ctx = context(&auth, &wes_token).await;
    let f = filter(&ctx, "handbook");
    assert_eq!(f.permission, Permission::Write as i32);
    assert!(!f.visible_only);

    // ---- denies: principal, group, everyone; folder and file -----------------
    let err = DenyTarget::from_fields("a/", "f-1").unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let err = DenyTarget::from_fields("", "").unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let err = Subject::from_ids("usr_a", "grp_b").unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let err = auth
        .put_deny(
            &admin_ctx,
            "handbook",
            &Subject::Everyone,
            &DenyTarget::Folder("/".into()),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        ErrorCode::InvalidArgument,
        "root is not a folder deny"
    );
    let err = auth
        .put_deny(
            &admin_ctx,
            "handbook",
            &principal("usr_nobody"),
            &DenyTarget::File("f-1".into()),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    let err = auth
        .put_deny(
            &admin_ctx,
            "nowhere",
            &Subject::Everyone,
            &DenyTarget::File("f-1".into()),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    let err = auth
        .put_deny(
            &ctx,
            "handbook",
            &Subject::Everyone,
            &DenyTarget::File("f-1".into()),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied);

    let bea_secret = auth
        .put_deny(
            &admin_ctx,
            "handbook",
            &principal(&bea.id),
            &DenyTarget::Folder("/secret".into()),
        )
        .await
        .unwrap();
    assert_eq!(bea_secret.path_prefix, "secret/");
    let same = auth
        .put_deny(
            &admin_ctx,
            "handbook",
            &principal(&bea.id),
            &DenyTarget::Folder("secret/".into()),
        )
        .await
        .unwrap();
    assert_eq!(same.id, bea_secret.id, "putting a deny twice keeps one");
    let group_file = auth
        .put_deny(
            &admin_ctx,
            "handbook",
            &Subject::Group(readers.id.clone()),
            &DenyTarget::File("f-7".into()),
        )
        .await
        .unwrap();
    assert_eq!(group_file.group_id, readers.id);
    auth.put_deny(
        &admin_ctx,
        "handbook",
        &Subject::Group(readers.id.clone()),
        &DenyTarget::Folder("archive/".into()),
    )
    .await
    .unwrap();
    let everyone_hr = auth
        .put_deny(
            &admin_ctx,
            "handbook",
            &Subject::Everyone,
            &DenyTarget::Folder("hr".into()),
        )
        .await
        .unwrap();
    assert!(everyone_hr.principal_id.is_empty() && everyone_hr.group_id.is_empty());
    let again = auth
        .put_deny(
            &admin_ctx,
            "handbook",
            &Subject::Everyone,
            &DenyTarget::Folder("hr/".into()),
        )
        .await
        .unwrap();
    assert_eq!(again.id, everyone_hr.id);
    auth.put_deny(
        &admin_ctx,
        "handbook",
        &Subject::Everyone,
        &DenyTarget::File("f-all".into()),
    )
    .await
    .unwrap();
    assert_eq!(
        auth.list_denies(&admin_ctx, "handbook")
            .await
            .unwrap()
            .len(),
        5
    );
    assert!(
        auth.list_denies(&admin_ctx, "finance")
            .await
            .unwrap()
            .is_empty()
    );

    // bea: her own folder deny, her group's folder and file denies, everyone's denies.
    let ctx = context(&auth, &bea_token).await;
    let f = filter(&ctx, "handbook");
    assert_eq!(f.allow_prefixes, vec![String::new()]);
    assert_eq!(f.deny_prefixes, strings(&["archive/", "hr/", "secret/"]));
    assert_eq!(f.deny_file_ids, strings(&["f-7", "f-all"]));
    // wes is in no group: only everyone's denies.
    let ctx = context(&auth, &wes_token).await;
    let f = filter(&ctx, "handbook");
    assert_eq!(f.deny_prefixes, strings(&["hr/"]));
    assert_eq!(f.deny_file_ids, strings(&["f-all"]));
    // Admins administer everything: no denies, hidden files visible.
    let ctx = context(&auth, &admin_token).await;
    let f = filter(&ctx, "handbook");
    assert!(f.deny_prefixes.is_empty() && f.deny_file_ids.is_empty());
    assert!(!f.visible_only);
    // A deny covering all a principal may read removes the namespace: asking
    // for it is an error naming it, never an empty answer.
    let cy = auth
        .create_principal(&admin_ctx, "cy", PrincipalKind::User, "", false)
        .await
        .unwrap();
    auth.put_grant(
        &admin_ctx,
        &principal(&cy.id),
        "handbook",
        Permission::Write,
        "hr/payroll/",
    )
    .await
    .unwrap();
    let (cy_token, _) = auth
        .create_pat(&admin_ctx, &cy.id, "cy", None)
        .await
        .unwrap();
    assert!(context(&auth, &cy_token).await.access.is_empty());
    let err = auth
        .authorize(&cy_token, "kg_search", &["handbook".to_owned()], "r")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
    assert!(err.to_string().contains("handbook"));

    // Leaving the group drops its grant and its deny on the next call.
    auth.remove_group_member(&admin_ctx, &readers.id, &bea.id)
        .await
        .unwrap();
    assert!(context(&auth, &bea_token).await.access.is_empty());
    let group = auth
        .add_group_member(&admin_ctx, &readers.id, &bea.id)
        .await
        .unwrap();
    assert_eq!(group.member_ids, vec![bea.id.clone()]);
    let err = auth
        .remove_group_member(&admin_ctx, &readers.id, "usr_nobody")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    // Deleting a deny applies on the next call.
    assert!(auth.delete_deny(&admin_ctx, &bea_secret.id).await.unwrap());
    assert!(!auth.delete_deny(&admin_ctx, &bea_secret.id).await.unwrap());
    let ctx = context(&auth, &bea_token).await;
    assert_eq!(
        filter(&ctx, "handbook").deny_prefixes,
        strings(&["archive/", "hr/"])
    );

    // ---- agent ∩ user with groups and denies ---------------------------------
    // ada joins the readers (handbook "" via the group, file f-7 denied) and is
    // denied one file herself; the agent writes all of handbook but is denied
    // `guides/old/`. Both sides' denies apply; either side's visible_only holds.
    auth.add_group_member(&admin_ctx, &readers.id, &user.id)
        .await
        .unwrap();
    auth.put_deny(
        &admin_ctx,
        "handbook",
        &principal(&user.id),
        &DenyTarget::File("f-ada".into()),
    )
    .await
    .unwrap();
    auth.put_grant(
        &admin_ctx,
        &principal(&agent.id),
        "handbook",
        Permission::Write,
        "",
    )
    .await
    .unwrap();
    auth.put_deny(
        &admin_ctx,
        "handbook",
        &principal(&agent.id),
        &DenyTarget::Folder("guides/old/".into()),
    )
    .await
    .unwrap();
    let ctx = context(&auth, &agent_token).await;
    assert_eq!(ctx.access.len(), 1, "finance is the agent's alone");
    assert_eq!(ctx.on_behalf_of, user.id);
    let f = filter(&ctx, "handbook");
    assert_eq!(f.allow_prefixes, vec![String::new()]);
    assert_eq!(
        f.deny_prefixes,
        strings(&["archive/", "guides/old/", "hr/"])
    );
    assert_eq!(f.deny_file_ids, strings(&["f-7", "f-ada", "f-all"]));
    assert_eq!(f.permission, Permission::Read as i32);
    assert!(f.visible_only);

    // ---- audit ------------------------------------------------------------------
    let lie = AuditEvent {
        id: "aud_forged".into(),
        at_ms: 1,
        principal_id: "usr_someone_else".into(),
        on_behalf_of: "usr_forged".into(),
        tool: "kg_search".into(),
        namespaces: strings(&["handbook"]),
        outcome: "ok".into(),
        latency_us: 1200,
        result_bytes: 512,
        request_id: "req-1".into(),
        transport: "http".into(),
        more_namespaces: 3,
        target: "/api/v1/grants/grant_1".into(),
    };
    let agent_ctx = context(&auth, &agent_token).await;
    // Recorded a moment after the call, as an event sent again after an auth restart is.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let stored = auth.record_audit(&agent_ctx, lie.clone()).await.unwrap();
    assert_eq!(stored.principal_id, agent.id);
    assert_eq!(stored.on_behalf_of, user.id);
    assert_ne!(stored.id, "aud_forged");
    // The time is the call's as the gateway gave it, bounded by the signed context: one before
    // auth issued the context is that moment (and one after now would be now).
    assert_eq!(stored.at_ms, agent_ctx.issued_at_ms);
    let bea_ctx = context(&auth, &bea_token).await;
    for bad in [
        AuditEvent {
            tool: "t".repeat(129),
            ..lie.clone()
        },
        AuditEvent {
            outcome: "o".repeat(65),
            ..lie.clone()
        },
        AuditEvent {
            outcome: String::new(),
            ..lie.clone()
        },
        AuditEvent {
            namespaces: vec!["handbook".to_owned(); 65],
            ..lie.clone()
        },
        AuditEvent {
            latency_us: -1,
            ..lie.clone()
        },
        AuditEvent {
            target: "/".repeat(kg_proto::limits::AUDIT_TARGET_LEN + 1),
            ..lie.clone()
        },
        AuditEvent {
            target: "/api/v1/grants/\n".into(),
            ..lie.clone()
        },
    ] {
        let err = auth.record_audit(&bea_ctx, bad).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
    }
    let mut recorded = BTreeSet::new();
    for i in 0..5 {
        let e = auth
            .record_audit(
                &bea_ctx,
                AuditEvent {
                    tool: if i % 2 == 0 { "kg_search" } else { "kg_read" }.into(),
                    request_id: format!("bea-{i}"),
                    ..lie.clone()
                },
            )
            .await
            .unwrap();
        assert_eq!(e.principal_id, bea.id);
        assert!(e.on_behalf_of.is_empty());
        recorded.insert(e.id);
    }
    let err = auth
        .list_audit(&bea_ctx, &ListAuditRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
    // Paging bea's events two at a time: newest first, each exactly once.
    let mut pages = Vec::new();
    let mut cursor = String::new();
    loop {
        let page = auth
            .list_audit(
                &admin_ctx,
                &ListAuditRequest {
                    principal_id: bea.id.clone(),
                    limit: 2,
                    cursor: cursor.clone(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        pages.push(page.events.len());
        cursor = page.next_cursor;
        for e in page.events {
            assert_eq!(e.principal_id, bea.id);
            assert_eq!(e.namespaces, strings(&["handbook"]));
            assert_eq!((e.latency_us, e.result_bytes), (1200, 512));
            assert_eq!(
                e.more_namespaces, 3,
                "the count of namespaces not listed is kept"
            );
            assert_eq!(e.target, "/api/v1/grants/grant_1");
            assert!(recorded.remove(&e.id), "each event once: {}", e.id);
        }
        if cursor.is_empty() {
            break;
        }
    }
    assert_eq!(pages, vec![2, 2, 1]);
    assert!(recorded.is_empty());
    let all = auth
        .list_audit(&admin_ctx, &ListAuditRequest::default())
        .await
        .unwrap();
    assert_eq!(all.events.len(), 6);
    assert!(all.next_cursor.is_empty());
    let keys: Vec<(i64, String)> = all.events.iter().map(|e| (e.at_ms, e.id.clone())).collect();
    let mut sorted = keys.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(keys, sorted, "newest first");
    assert_eq!(all.events.last().unwrap().principal_id, agent.id);
    let reads = auth
        .list_audit(
            &admin_ctx,
            &ListAuditRequest {
                tool: "kg_read".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(reads.events.len(), 2);
    let future = auth
        .list_audit(
            &admin_ctx,
            &ListAuditRequest {
                since_ms: Some(now_ms() + 3_600_000),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(future.events.is_empty());
    let past = auth
        .list_audit(
            &admin_ctx,
            &ListAuditRequest {
                until_ms: Some(now_ms() + 1),
                since_ms: Some(stored.at_ms),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(past.events.len(), 6);
    for bad in [
        ListAuditRequest {
            limit: 1001,
            ..Default::default()
        },
        ListAuditRequest {
            cursor: "not a cursor".into(),
            ..Default::default()
        },
        ListAuditRequest {
            since_ms: Some(10),
            until_ms: Some(10),
            ..Default::default()
        },
    ] {
        let err = auth.list_audit(&admin_ctx, &bad).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
    }

    // ---- PAT rotation -------------------------------------------------------------
    let err = auth.rotate_pat(&bea_ctx, &bea_pat.id).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
    let err = auth
        .rotate_pat(&admin_ctx, "pat_nothing")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    let (rotated_token, rotated) = auth.rotate_pat(&admin_ctx, &bea_pat.id).await.unwrap();
    assert_ne!(rotated_token, bea_token);
    assert_eq!(
        (
            &rotated.id,
            &rotated.principal_id,
            &rotated.name,
            rotated.expires_at_ms
        ),
        (
            &bea_pat.id,
            &bea_pat.principal_id,
            &bea_pat.name,
            bea_pat.expires_at_ms
        )
    );
    assert!(rotated_token.starts_with(&rotated.prefix));
    let err = auth
        .authorize(&bea_token, "kg_search", &[], "r")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unauthenticated, "old secret fails");
    assert_eq!(context(&auth, &rotated_token).await.principal_id, bea.id);
    let listed = auth.list_pats(&admin_ctx, &bea.id).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].prefix, rotated.prefix);
    assert!(auth.revoke_pat(&admin_ctx, &bea_pat.id).await.unwrap());
    // Revoking again is done already, not "not found"; an unknown id stays not found.
    assert!(auth.revoke_pat(&admin_ctx, &bea_pat.id).await.unwrap());
    assert!(!auth.revoke_pat(&admin_ctx, "pat_nothing").await.unwrap());
    let err = auth.rotate_pat(&admin_ctx, &bea_pat.id).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    let err = auth
        .authorize(&rotated_token, "kg_search", &[], "r")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unauthenticated);

    // ---- tokens identify their deployment -------------------------------------------
    // Another deployment on the same database, even with the same hashing key:
    // its tokens fail here and ours fail there.
    let other = AuthService::new(
        sql.clone(),
        ContextSigner::generate(),
        PAT_KEY.to_vec(),
        "dep-2".into(),
    )
    .await
    .unwrap();
    let (foreign_token, _) = other
        .create_pat(&admin_ctx, &wes.id, "elsewhere", None)
        .await
        .unwrap();
    assert!(kg_auth::looks_valid(&foreign_token));
    assert_eq!(context(&other, &foreign_token).await.principal_id, wes.id);
    let err = auth
        .authorize(&foreign_token, "kg_search", &[], "r")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unauthenticated);
    let err = other
        .authorize(&wes_token, "kg_search", &[], "r")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unauthenticated);
    assert_eq!(context(&auth, &wes_token).await.principal_id, wes.id);

    // ---- revocation and grant removal apply on the next call -------------------------
    let pats = auth.list_pats(&admin_ctx, &user.id).await.unwrap();
    assert_eq!(pats.len(), 1);
    assert!(user_token.starts_with(&pats[0].prefix));
    assert!(pats[0].last_used_at_ms.is_some());
    assert!(auth.revoke_pat(&admin_ctx, &user_pat.id).await.unwrap());
    let err = auth
        .authorize(&user_token, "kg_search", &[], "r5")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unauthenticated);

    let grants = auth
        .list_grants(&admin_ctx, &principal(&agent.id))
        .await
        .unwrap();
    assert_eq!(grants.len(), 2);
    for g in grants {
        auth.delete_grant(&admin_ctx, &g.id).await.unwrap();
    }
    assert!(context(&auth, &agent_token).await.access.is_empty());

    // ---- what Authorize remembers never outlives a change, on any replica -------------
    // A second auth process on the same database: it caches per token, and learns of the
    // first one's changes (and of hand-written SQL) only through the access epoch.
    let replica = AuthService::new(
        sql.clone(),
        ContextSigner::generate(),
        PAT_KEY.to_vec(),
        "dep-1".into(),
    )
    .await
    .unwrap();
    let kim = auth
        .create_principal(&admin_ctx, "kim", PrincipalKind::User, "", false)
        .await
        .unwrap();
    auth.put_grant(
        &admin_ctx,
        &principal(&kim.id),
        "handbook",
        Permission::Read,
        "",
    )
    .await
    .unwrap();
    let (kim_token, kim_pat) = auth
        .create_pat(&admin_ctx, &kim.id, "kim", None)
        .await
        .unwrap();
    let epoch = || async {
        sqlx::query_scalar::<_, i64>("SELECT epoch FROM kg_auth_epoch WHERE id = 1")
            .fetch_one(sql.pool())
            .await
            .unwrap()
    };
    let before = epoch().await;
    let first = context(&replica, &kim_token).await;
    assert_eq!(filter(&first, "handbook").allow_prefixes, strings(&[""]));
    // Recording the use rewrites the PAT's last-used time, which is not access.
    assert_eq!(epoch().await, before, "a use must not move the epoch");
    assert!(
        auth.list_pats(&admin_ctx, &kim.id).await.unwrap()[0]
            .last_used_at_ms
            .is_some()
    );
    let again = context(&replica, &kim_token).await;
    assert_eq!(again.access, first.access);

    let deny = auth
        .put_deny(
            &admin_ctx,
            "handbook",
            &principal(&kim.id),
            &DenyTarget::Folder("kim-drafts".into()),
        )
        .await
        .unwrap();
    assert!(epoch().await > before);
    let drafts_denied = |ctx: &CallerContext| {
        filter(ctx, "handbook")
            .deny_prefixes
            .contains(&"kim-drafts/".to_owned())
    };
    assert!(drafts_denied(&context(&replica, &kim_token).await));

    // An operator's own SQL is seen too: the epoch moves with the statement itself.
    let deleted = sqlx::query("DELETE FROM kg_denies WHERE id = $1")
        .bind(&deny.id)
        .execute(sql.pool())
        .await
        .unwrap();
    assert_eq!(deleted.rows_affected(), 1);
    assert!(!drafts_denied(&context(&replica, &kim_token).await));
    sqlx::query("DELETE FROM kg_grants WHERE principal_id = $1")
        .bind(&kim.id)
        .execute(sql.pool())
        .await
        .unwrap();
    assert!(context(&replica, &kim_token).await.access.is_empty());

    assert!(auth.revoke_pat(&admin_ctx, &kim_pat.id).await.unwrap());
    let err = replica
        .authorize(&kim_token, "kg_search", &[], "r")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unauthenticated);

    // Garbage, unknown and old-format tokens are the same error.
    for bad in [
        "",
        "kg_pat_x",
        "Bearer abc",
        &format!("kg_pat_{}", "A".repeat(43)),
        &format!("kg_pat_{}", "A".repeat(51)),
    ] {
        let err = auth.authorize(bad, "t", &[], "r").await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unauthenticated, "{bad}");
    }

    principal_disabling(&auth, &replica, &admin_ctx, &admin_token).await;
    namespace_deletion(&auth, &sql, &admin_ctx, &admin_token).await;
    audit_retention(&auth, &sql, &admin_ctx).await;
}

/// A disabled principal's tokens, and those of agents acting for it, fail from the next call
/// on, on every replica; enabled again, it has what it had. No admin disables itself, and the
/// last enabled admin stays enabled, also when two admins disable each other at once.
async fn principal_disabling(
    auth: &AuthService,
    replica: &AuthService,
    admin_ctx: &CallerContext,
    admin_token: &str,
) {
    let lea = auth
        .create_principal(admin_ctx, "lea", PrincipalKind::User, "", false)
        .await
        .unwrap();
    let lea_bot = auth
        .create_principal(admin_ctx, "lea-bot", PrincipalKind::Agent, &lea.id, false)
        .await
        .unwrap();
    for p in [&lea, &lea_bot] {
        assert_eq!(p.disabled_at_ms, 0);
        auth.put_grant(
            admin_ctx,
            &principal(&p.id),
            "handbook",
            Permission::Read,
            "",
        )
        .await
        .unwrap();
    }
    let (lea_token, _) = auth
        .create_pat(admin_ctx, &lea.id, "laptop", None)
        .await
        .unwrap();
    let (bot_token, _) = auth
        .create_pat(admin_ctx, &lea_bot.id, "bot", None)
        .await
        .unwrap();
    // Resolved, and so cached, on both replicas before the change.
    let lea_before = context(replica, &lea_token).await;
    let bot_before = context(auth, &bot_token).await;
    let lea_ctx = context(auth, &lea_token).await;

    let err = auth
        .set_principal_disabled(&lea_ctx, &lea_bot.id, true)
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        ErrorCode::PermissionDenied,
        "only admins disable"
    );
    let err = auth
        .set_principal_disabled(admin_ctx, "usr_nobody", true)
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    for bad in ["", "usr-x", "usr_é", &"u".repeat(65)] {
        let err = auth
            .set_principal_disabled(admin_ctx, bad, true)
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{bad:?}");
        assert!(!err.to_string().contains("uuuuu"), "{err}");
    }

    let disabled = auth
        .set_principal_disabled(admin_ctx, &lea.id, true)
        .await
        .unwrap();
    assert!(disabled.disabled_at_ms > 0);
    for token in [&lea_token, &bot_token] {
        for service in [auth, replica] {
            let err = service
                .authorize(token, "kg_search", &[], "r")
                .await
                .unwrap_err();
            assert_eq!(err.code(), ErrorCode::Unauthenticated);
            assert!(err.to_string().contains("disabled"), "{err}");
        }
    }
    // Listed as disabled, since the first time; nothing of it is removed.
    let again = auth
        .set_principal_disabled(admin_ctx, &lea.id, true)
        .await
        .unwrap();
    assert_eq!(again.disabled_at_ms, disabled.disabled_at_ms);
    let listed = auth.list_principals(admin_ctx).await.unwrap();
    let listed_lea = listed.iter().find(|p| p.id == lea.id).unwrap();
    assert_eq!(listed_lea.disabled_at_ms, disabled.disabled_at_ms);
    let listed_bot = listed.iter().find(|p| p.id == lea_bot.id).unwrap();
    assert_eq!(
        listed_bot.disabled_at_ms, 0,
        "the agent itself is not disabled"
    );
    let pats = auth.list_pats(admin_ctx, &lea.id).await.unwrap();
    assert_eq!(pats.len(), 1);
    assert!(pats[0].revoked_at_ms.is_none());

    let enabled = auth
        .set_principal_disabled(admin_ctx, &lea.id, false)
        .await
        .unwrap();
    assert_eq!(enabled.disabled_at_ms, 0);
    assert_eq!(context(replica, &lea_token).await.access, lea_before.access);
    assert_eq!(context(auth, &bot_token).await.access, bot_before.access);

    // No admin shuts itself out.
    let err = auth
        .set_principal_disabled(admin_ctx, &admin_ctx.principal_id, true)
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    assert!(err.to_string().contains("signed in as"), "{err}");

    // Two admins disabling each other at once: one wins, the other is the last enabled admin.
    let second = auth
        .create_principal(admin_ctx, "root-2", PrincipalKind::User, "", true)
        .await
        .unwrap();
    let (second_token, _) = auth
        .create_pat(admin_ctx, &second.id, "root-2", None)
        .await
        .unwrap();
    let second_ctx = auth
        .authorize(&second_token, "admin", &[], "r")
        .await
        .unwrap()
        .decoded
        .unwrap();
    assert!(second_ctx.is_admin);
    for round in 0..40 {
        let (first_result, second_result) = tokio::join!(
            auth.set_principal_disabled(admin_ctx, &second.id, true),
            replica.set_principal_disabled(&second_ctx, &admin_ctx.principal_id, true),
        );
        let (winner_ctx, loser_id, refused) = match (first_result, second_result) {
            (Ok(_), Err(err)) => (admin_ctx, second.id.clone(), err),
            (Err(err), Ok(_)) => (&second_ctx, admin_ctx.principal_id.clone(), err),
            (a, b) => panic!("round {round}: both or neither disabled: {a:?} {b:?}"),
        };
        assert_eq!(refused.code(), ErrorCode::FailedPrecondition);
        assert!(
            refused.to_string().contains("last enabled admin"),
            "{refused}"
        );
        auth.set_principal_disabled(winner_ctx, &loser_id, false)
            .await
            .unwrap();
    }
    assert!(auth.authorize(admin_token, "admin", &[], "r").await.is_ok());
}

/// The audit retention deletes the events recorded before its cut-off, in batches (1,001 of
/// them, past two), and nothing recorded at or after it.
async fn audit_retention(auth: &AuthService, sql: &SqlStore, admin_ctx: &CallerContext) {
    let listed = async |since_ms: Option<i64>, until_ms: Option<i64>| {
        let request = ListAuditRequest {
            limit: 1000,
            since_ms,
            until_ms,
            ..Default::default()
        };
        auth.list_audit(admin_ctx, &request).await.unwrap().events
    };
    let recent = listed(None, None).await;
    assert!(!recent.is_empty(), "the scenario recorded events");
    let cut_off = now_ms() - 7 * 86_400_000;
    // 1,001 events before the cut-off, oldest 30 days back, and one at it.
    for first in (0..=1_000).step_by(100) {
        let rows: Vec<String> = (first..(first + 100).min(1_001))
            .map(|i| {
                format!(
                    "('aud_old_{i:04}', {}, 'usr_x', '', 'kg_search', '[]', 'ok', 1, 1, '', 'http')",
                    cut_off - 23 * 86_400_000 + i
                )
            })
            .collect();
        let insert = format!(
            "INSERT INTO kg_audit (id, at_ms, principal_id, on_behalf_of, tool, namespaces, \
             outcome, latency_us, result_bytes, request_id, transport) VALUES {}",
            rows.join(", ")
        );
        sqlx::query(sqlx::AssertSqlSafe(insert))
            .execute(sql.pool())
            .await
            .unwrap();
    }
    sqlx::query(
        "INSERT INTO kg_audit (id, at_ms, principal_id, on_behalf_of, tool, namespaces, \
         outcome, latency_us, result_bytes, request_id, transport) \
         VALUES ('aud_at_cut_off', $1, 'usr_x', '', 'kg_search', '[]', 'ok', 1, 1, '', 'http')",
    )
    .bind(cut_off)
    .execute(sql.pool())
    .await
    .unwrap();
    assert_eq!(listed(None, Some(cut_off + 1)).await.len(), 1_000, "a page");

    assert_eq!(auth.prune_audit(cut_off).await.unwrap(), 1_001);
    let left = listed(None, Some(cut_off + 1)).await;
    assert_eq!(
        left.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        ["aud_at_cut_off"]
    );
    assert_eq!(listed(Some(cut_off + 1), None).await, recent);
    assert_eq!(auth.prune_audit(cut_off).await.unwrap(), 0);
    let pruned = kg_common::metrics::encode_text()
        .lines()
        .find_map(|line| line.strip_prefix("kgmesh_audit_events_pruned_total "))
        .and_then(|value| value.trim().parse::<u64>().ok());
    assert!(pruned.is_some_and(|n| n >= 1_001), "{pruned:?}");
}

/// Retiring a namespace cuts every token off it at once and keeps its name taken until it is
/// deleted; a grant that slips in meanwhile reaches nobody and goes with it.
async fn namespace_deletion(
    auth: &AuthService,
    sql: &SqlStore,
    admin_ctx: &CallerContext,
    admin_token: &str,
) {
    let ns = "retiring";
    auth.create_namespace(admin_ctx, ns, "").await.unwrap();
    let reader = auth
        .create_principal(admin_ctx, "rita", PrincipalKind::User, "", false)
        .await
        .unwrap();
    auth.put_grant(admin_ctx, &principal(&reader.id), ns, Permission::Read, "")
        .await
        .unwrap();
    auth.put_deny(
        admin_ctx,
        ns,
        &principal(&reader.id),
        &DenyTarget::Folder("private".into()),
    )
    .await
    .unwrap();
    let (reader_token, _) = auth
        .create_pat(admin_ctx, &reader.id, "laptop", None)
        .await
        .unwrap();
    let reaches = async |token: &str| {
        context(auth, token)
            .await
            .access
            .iter()
            .any(|a| a.namespace == ns)
    };
    assert!(reaches(&reader_token).await);
    assert!(reaches(admin_token).await);

    let live = auth.delete_namespace(admin_ctx, ns).await.unwrap_err();
    assert_eq!(live.code(), ErrorCode::FailedPrecondition, "{live}");
    let reader_ctx = context(auth, &reader_token).await;
    let refused = auth.retire_namespace(&reader_ctx, ns).await.unwrap_err();
    assert_eq!(refused.code(), ErrorCode::PermissionDenied);

    let retired = auth.retire_namespace(admin_ctx, ns).await.unwrap();
    assert_eq!(retired.namespace.as_ref().unwrap().name, ns);
    assert_eq!((retired.grants_removed, retired.denies_removed), (1, 1));
    assert!(
        !reaches(&reader_token).await,
        "a retired namespace reaches no reader"
    );
    assert!(!reaches(admin_token).await, "nor an admin");
    let listed = auth.list_namespaces(admin_ctx).await.unwrap();
    assert!(listed.iter().all(|n| n.name != ns), "{listed:?}");
    let grant = auth
        .put_grant(admin_ctx, &principal(&reader.id), ns, Permission::Read, "")
        .await
        .unwrap_err();
    assert_eq!(grant.code(), ErrorCode::NotFound, "{grant}");
    let again = auth.create_namespace(admin_ctx, ns, "").await.unwrap_err();
    assert_eq!(again.code(), ErrorCode::FailedPrecondition);
    assert!(again.to_string().contains("being deleted"), "{again}");

    // Retiring again answers it as it is: the deletion resumes.
    let resumed = auth.retire_namespace(admin_ctx, ns).await.unwrap();
    assert_eq!(resumed.retired_at_ms, retired.retired_at_ms);
    assert_eq!((resumed.grants_removed, resumed.denies_removed), (0, 0));

    // A grant written while it was retired (a race, or an operator's SQL) reaches nobody, and
    // does not stop the deletion.
    sqlx::query(
        "INSERT INTO kg_grants (id, principal_id, group_id, namespace, permission, path_prefix, created_at_ms) \
         VALUES ('gr_late', $1, NULL, $2, 'read', '', 0)",
    )
    .bind(&reader.id)
    .bind(ns)
    .execute(sql.pool())
    .await
    .unwrap();
    assert!(!reaches(&reader_token).await);
    auth.delete_namespace(admin_ctx, ns).await.unwrap();
    let gone = auth.delete_namespace(admin_ctx, ns).await.unwrap_err();
    assert_eq!(gone.code(), ErrorCode::NotFound);
    let unknown = auth.retire_namespace(admin_ctx, ns).await.unwrap_err();
    assert_eq!(unknown.code(), ErrorCode::NotFound);

    // The name is free again, and the new namespace starts with nobody's grants.
    auth.create_namespace(admin_ctx, ns, "again").await.unwrap();
    assert!(!reaches(&reader_token).await);
    assert!(reaches(admin_token).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn auth_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("auth.db").display());
    scenario(SqlStore::connect(&url).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn auth_on_postgres() {
    let venv = find_venv().expect("run deploy/scripts/dev-deps.sh first");
    let dir = tempfile::tempdir().unwrap();
    let pg = EmbeddedPostgres::start(&venv, dir.path()).await.unwrap();
    scenario(SqlStore::connect(&pg.url).await.unwrap()).await;
}
