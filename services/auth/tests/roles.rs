//! Roles for generated ontology tools come from `role:<name>` groups; an agent
//! holds only the roles both it and its user have; admins also hold `admin`. And the
//! bounds of a PAT's expiry.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kg_auth::AuthService;
use kg_common::ErrorExt as _;
use kg_common::caller::ContextSigner;
use kg_proto::v1::{CallerContext, PrincipalKind};

/// An auth service on a fresh SQLite file, with its first admin.
struct Fixture {
    _dir: tempfile::TempDir,
    url: String,
    auth: AuthService,
    admin: CallerContext,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("a.db").display());
    let sql = kg_stores::sql::SqlStore::connect(&url).await.unwrap();
    let auth = AuthService::new(sql, ContextSigner::generate(), vec![7; 32], "dep".into())
        .await
        .unwrap();
    let admin_token = auth.bootstrap_admin().await.unwrap().unwrap();
    let admin = auth
        .authorize(&admin_token, "admin", &[], "r")
        .await
        .unwrap()
        .decoded
        .unwrap();
    Fixture {
        _dir: dir,
        url,
        auth,
        admin,
    }
}

#[tokio::test]
async fn roles_come_from_role_groups() {
    // `_dir` is bound: the database file lives as long as the test.
    let Fixture {
        _dir, auth, admin, ..
    } = fixture().await;
    assert_eq!(admin.roles, ["admin"]);

    let user = auth
        .create_principal(&admin, "sam", PrincipalKind::User, "", false)
        .await
        .unwrap();
    let agent = auth
        .create_principal(&admin, "bot", PrincipalKind::Agent, &user.id, false)
        .await
        .unwrap();
    let (user_token, _) = auth.create_pat(&admin, &user.id, "u", None).await.unwrap();
    let (agent_token, _) = auth.create_pat(&admin, &agent.id, "a", None).await.unwrap();
    let roles = |token: String| {
        let auth = auth.clone();
        async move {
            auth.authorize(&token, "t", &[], "r")
                .await
                .unwrap()
                .decoded
                .unwrap()
                .roles
        }
    };
    assert!(roles(user_token.clone()).await.is_empty());

    let support = auth.create_group(&admin, "role:support").await.unwrap();
    let billing = auth.create_group(&admin, "role:billing").await.unwrap();
    let plain = auth.create_group(&admin, "support-team").await.unwrap();
    auth.add_group_member(&admin, &support.id, &user.id)
        .await
        .unwrap();
    auth.add_group_member(&admin, &plain.id, &user.id)
        .await
        .unwrap();
    auth.add_group_member(&admin, &billing.id, &agent.id)
        .await
        .unwrap();
    auth.add_group_member(&admin, &support.id, &agent.id)
        .await
        .unwrap();
    assert_eq!(roles(user_token.clone()).await, ["support"]);
    // The agent holds support and billing, its user only support.
    assert_eq!(roles(agent_token.clone()).await, ["support"]);

    // A stdio launcher's asserted role replaces the granted ones in the signed context
    // (empty: none); a role that is not a role name is refused before anything is read.
    let asserted = |token: String, role: &'static str| {
        let auth = auth.clone();
        async move {
            auth.authorize_as(&token, "t", &[], "r", Some(role))
                .await
                .map(|r| r.decoded.unwrap().roles)
        }
    };
    assert_eq!(
        asserted(user_token.clone(), "billing").await.unwrap(),
        ["billing"]
    );
    assert!(asserted(user_token.clone(), "").await.unwrap().is_empty());
    for bad in ["Billing", "billing; drop", "role\nforged"] {
        let err = asserted(user_token.clone(), bad).await.unwrap_err();
        assert_eq!(err.code(), kg_common::ErrorCode::InvalidArgument, "{bad}");
        assert!(err.to_string().contains("is not a role name"), "{err}");
    }
    // Still no role without the token's say-so: a bad token is refused whatever it asserts.
    let err = asserted("kg_pat_nope".to_owned(), "billing")
        .await
        .unwrap_err();
    assert_eq!(err.code(), kg_common::ErrorCode::Unauthenticated, "{err}");

    // Revocation takes effect on the next call.
    auth.remove_group_member(&admin, &support.id, &user.id)
        .await
        .unwrap();
    assert!(roles(user_token).await.is_empty());
    assert!(roles(agent_token).await.is_empty());
}

/// An agent is never an admin: one cannot be created with the flag, and a row that has it
/// (written before the rule) does not mint an admin context.
#[tokio::test]
async fn an_agent_is_never_an_admin() {
    let Fixture {
        _dir,
        url,
        auth,
        admin,
    } = fixture().await;
    assert!(admin.is_admin);
    let refused = auth
        .create_principal(&admin, "bot", PrincipalKind::Agent, "", true)
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("an agent cannot be an admin"),
        "{refused}"
    );

    let agent = auth
        .create_principal(&admin, "bot", PrincipalKind::Agent, "", false)
        .await
        .unwrap();
    let raw = sqlx::AnyPool::connect(&url).await.unwrap();
    sqlx::query("UPDATE kg_principals SET is_admin = 1 WHERE id = $1")
        .bind(&agent.id)
        .execute(&raw)
        .await
        .unwrap();
    let (token, _) = auth.create_pat(&admin, &agent.id, "a", None).await.unwrap();
    let context = auth
        .authorize(&token, "admin", &[], "r")
        .await
        .unwrap()
        .decoded
        .unwrap();
    assert!(!context.is_admin, "{context:?}");
}

#[tokio::test]
async fn a_pat_expires_in_the_future_and_within_ten_years() {
    // `_dir` is bound: the database file lives as long as the test.
    let Fixture {
        _dir, auth, admin, ..
    } = fixture().await;
    let day = 86_400_000;
    let now = kg_common::caller::now_ms();
    for (expires, problem) in [
        (now - 1, "expiresAtMs must be in the future"),
        (now + 3651 * day, "more than 3650 days away"),
    ] {
        let err = auth
            .create_pat(&admin, &admin.principal_id, "t", Some(expires))
            .await
            .unwrap_err();
        assert_eq!(err.code(), kg_common::ErrorCode::InvalidArgument);
        assert!(err.to_string().contains(problem), "{err}");
    }
    let (_, pat) = auth
        .create_pat(&admin, &admin.principal_id, "t", Some(now + 3649 * day))
        .await
        .unwrap();
    assert_eq!(pat.expires_at_ms, Some(now + 3649 * day));
}
