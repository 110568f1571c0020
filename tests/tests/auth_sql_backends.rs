//! The auth service's SQL runs unchanged on SQLite and PostgreSQL: the same
//! scenario against both real backends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kg_auth::AuthService;
use kg_common::ErrorCode;
use kg_common::ErrorExt as _;
use kg_common::caller::{ContextSigner, ContextVerifier, now_ms};
use kg_proto::v1::{Permission, PrincipalKind};
use kg_stores::embedded::{EmbeddedPostgres, find_venv};
use kg_stores::sql::SqlStore;

async fn scenario(sql: SqlStore) {
    let signer = ContextSigner::generate();
    let verifier = ContextVerifier::new(vec![signer.public_key()]);
    let auth = AuthService::new(
        sql,
        signer,
        b"0123456789abcdef0123456789abcdef".to_vec(),
        "dep-1".into(),
    )
    .await
    .unwrap();

    let admin_token = auth
        .bootstrap_admin()
        .await
        .unwrap()
        .expect("first start creates an admin");
    assert!(
        auth.bootstrap_admin().await.unwrap().is_none(),
        "admin is created once"
    );
    let admin = auth
        .authorize(&admin_token, "test", &[], "r1")
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
        &user.id,
        "handbook",
        Permission::Read,
        "guides/",
    )
    .await
    .unwrap();
    auth.put_grant(&admin_ctx, &agent.id, "handbook", Permission::Read, "")
        .await
        .unwrap();
    auth.put_grant(&admin_ctx, &agent.id, "finance", Permission::Read, "")
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

    // The user reads only its folder; it is not an admin.
    let ctx = auth
        .authorize(&user_token, "kg_search", &[], "r2")
        .await
        .unwrap()
        .decoded
        .unwrap();
    assert!(!ctx.is_admin);
    assert_eq!(ctx.access.len(), 1);
    assert_eq!(ctx.access[0].allow_prefixes, vec!["guides/".to_owned()]);
    let denied = auth.create_namespace(&ctx, "x", "").await.unwrap_err();
    assert_eq!(denied.code(), ErrorCode::PermissionDenied);

    // The agent reads what both read: handbook/guides only, not finance.
    let ctx = auth
        .authorize(&agent_token, "kg_search", &[], "r3")
        .await
        .unwrap()
        .decoded
        .unwrap();
    assert_eq!(ctx.access.len(), 1);
    assert_eq!(ctx.access[0].namespace, "handbook");
    assert_eq!(ctx.access[0].allow_prefixes, vec!["guides/".to_owned()]);
    let err = auth
        .authorize(&agent_token, "kg_search", &["finance".to_owned()], "r4")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::PermissionDenied);
    assert!(err.to_string().contains("finance"));

    // PATs are listed without secrets; revocation applies on the next call.
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

    // Removing a grant applies on the next call too.
    let grants = auth.list_grants(&admin_ctx, &agent.id).await.unwrap();
    for g in grants {
        auth.delete_grant(&admin_ctx, &g.id).await.unwrap();
    }
    let ctx = auth
        .authorize(&agent_token, "kg_search", &[], "r6")
        .await
        .unwrap()
        .decoded
        .unwrap();
    assert!(ctx.access.is_empty());

    // Garbage and unknown tokens are the same error.
    for bad in [
        "",
        "kg_pat_x",
        "Bearer abc",
        &format!("kg_pat_{}", "A".repeat(43)),
    ] {
        let err = auth.authorize(bad, "t", &[], "r").await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unauthenticated, "{bad}");
    }
}

#[tokio::test]
async fn auth_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("auth.db").display());
    scenario(SqlStore::connect(&url).await.unwrap()).await;
}

#[tokio::test]
async fn auth_on_postgres() {
    let venv = find_venv().expect("run deploy/scripts/dev-deps.sh first");
    let dir = tempfile::tempdir().unwrap();
    let pg = EmbeddedPostgres::start(&venv, dir.path()).await.unwrap();
    scenario(SqlStore::connect(&pg.url).await.unwrap()).await;
}
