//! The auth domain: authorize tokens into signed caller contexts, and the
//! admin operations on namespaces, principals, grants and PATs.

use std::collections::BTreeMap;
use std::sync::Arc;

use kg_common::access::{normalize_folder_prefix, validate_namespace};
use kg_common::caller::{CONTEXT_TTL_MS, ContextSigner, PublicKey, now_ms, require_admin};
use kg_proto::v1::{
    AccessFilter, AuthorizeResponse, CallerContext, Grant, Namespace, Pat, Permission, Principal,
    PrincipalKind,
};

use crate::error::{AuthError, Result};
use crate::pat::{self, PatHasher};
use crate::resolve::{admin_filters, filters_from_grants, intersect};
use crate::store::AuthStore;

/// Longest accepted display name.
const MAX_NAME_LEN: usize = 200;

/// The auth service's state.
#[derive(Clone)]
pub struct AuthService {
    store: AuthStore,
    signer: Arc<ContextSigner>,
    hasher: PatHasher,
    deployment_id: String,
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

fn check_name(what: &str, name: &str) -> Result<()> {
    if name.trim().is_empty() || name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
        return Err(AuthError::Invalid(format!(
            "{what} must be 1-{MAX_NAME_LEN} characters without control characters"
        )));
    }
    Ok(())
}

impl AuthService {
    /// Opens the store (running migrations) with the deployment's keys.
    pub async fn new(
        sql: kg_stores::sql::SqlStore,
        signer: ContextSigner,
        pat_key: Vec<u8>,
        deployment_id: String,
    ) -> Result<Self> {
        Ok(Self {
            store: AuthStore::open(sql).await?,
            signer: Arc::new(signer),
            hasher: PatHasher::new(pat_key),
            deployment_id,
        })
    }

    /// The verifying key services must trust.
    pub fn public_key(&self) -> PublicKey {
        self.signer.public_key()
    }

    /// The id of this deployment, carried in every context.
    pub fn deployment_id(&self) -> &str {
        &self.deployment_id
    }

    /// Resolves a token into a signed caller context. Runs on every call:
    /// revoking a PAT or a grant takes effect on the next one.
    pub async fn authorize(
        &self,
        token: &str,
        tool: &str,
        namespaces: &[String],
        request_id: &str,
    ) -> Result<AuthorizeResponse> {
        if !pat::looks_valid(token) {
            return Err(AuthError::InvalidToken);
        }
        let owner = self
            .store
            .pat_owner(&self.hasher.hash(token))
            .await?
            .ok_or(AuthError::InvalidToken)?;
        let now = now_ms();
        if owner.revoked_at_ms.is_some() || owner.expires_at_ms.is_some_and(|e| e <= now) {
            return Err(AuthError::InvalidToken);
        }
        if let Err(err) = self.store.touch_pat(&owner.pat_id, now).await {
            tracing::warn!(error = %err, "could not record PAT use");
        }
        let principal = owner.principal;
        let mut access = self.access_of(&principal).await?;
        if !namespaces.is_empty() {
            let mut selected = BTreeMap::new();
            for ns in namespaces {
                let filter = access
                    .remove(ns)
                    .ok_or_else(|| AuthError::NamespaceDenied(ns.clone()))?;
                selected.insert(ns.clone(), filter);
            }
            access = selected;
        }
        let context = CallerContext {
            principal_id: principal.id.clone(),
            principal_kind: principal.kind,
            on_behalf_of: principal.acts_for.clone(),
            roles: if principal.is_admin {
                vec!["admin".to_owned()]
            } else {
                Vec::new()
            },
            access: access.into_values().collect(),
            issued_at_ms: now,
            expires_at_ms: now + CONTEXT_TTL_MS,
            request_id: request_id.to_owned(),
            tool: tool.to_owned(),
            deployment_id: self.deployment_id.clone(),
            is_admin: principal.is_admin,
        };
        Ok(AuthorizeResponse {
            context: Some(self.signer.sign(&context)),
            decoded: Some(context),
        })
    }

    async fn access_of(&self, principal: &Principal) -> Result<BTreeMap<String, AccessFilter>> {
        let own = self.own_access(principal).await?;
        if principal.kind() != PrincipalKind::Agent || principal.acts_for.is_empty() {
            return Ok(own);
        }
        // An agent reads only what both it and its user may read.
        let user = self
            .store
            .get_principal(&principal.acts_for)
            .await?
            .ok_or(AuthError::InvalidToken)?;
        let user_access = self.own_access(&user).await?;
        Ok(intersect(&own, &user_access))
    }

    async fn own_access(&self, principal: &Principal) -> Result<BTreeMap<String, AccessFilter>> {
        if principal.is_admin {
            return Ok(admin_filters(&self.store.namespace_names().await?));
        }
        Ok(filters_from_grants(
            &self.store.grant_rows(&principal.id).await?,
        ))
    }

    /// Creates the first admin principal and a PAT for it when no admin exists
    /// yet; returns the token (shown once) or `None` when an admin exists.
    pub async fn bootstrap_admin(&self) -> Result<Option<String>> {
        if self.store.any_admin().await? {
            return Ok(None);
        }
        let principal = Principal {
            id: new_id("usr"),
            name: "admin".to_owned(),
            kind: PrincipalKind::User as i32,
            acts_for: String::new(),
            is_admin: true,
            created_at_ms: now_ms(),
        };
        self.store.create_principal(&principal).await?;
        let (token, _) = self
            .issue_pat(&principal.id, "bootstrap admin", None)
            .await?;
        Ok(Some(token))
    }

    async fn issue_pat(
        &self,
        principal_id: &str,
        name: &str,
        expires_at_ms: Option<i64>,
    ) -> Result<(String, Pat)> {
        check_name("PAT name", name)?;
        if let Some(exp) = expires_at_ms
            && exp <= now_ms()
        {
            return Err(AuthError::Invalid(
                "expiresAtMs must be in the future".to_owned(),
            ));
        }
        let (token, prefix) = pat::generate();
        let pat = Pat {
            id: new_id("pat"),
            principal_id: principal_id.to_owned(),
            name: name.to_owned(),
            prefix,
            created_at_ms: now_ms(),
            last_used_at_ms: None,
            expires_at_ms,
            revoked_at_ms: None,
        };
        self.store
            .create_pat(&pat, &self.hasher.hash(&token))
            .await?;
        Ok((token, pat))
    }

    /// Admin: create a namespace.
    pub async fn create_namespace(
        &self,
        caller: &CallerContext,
        name: &str,
        description: &str,
    ) -> Result<Namespace> {
        require_admin(caller)?;
        validate_namespace(name)?;
        let ns = Namespace {
            name: name.to_owned(),
            description: description.to_owned(),
            created_at_ms: now_ms(),
        };
        self.store.create_namespace(&ns).await?;
        Ok(ns)
    }

    /// Admin: every namespace.
    pub async fn list_namespaces(&self, caller: &CallerContext) -> Result<Vec<Namespace>> {
        require_admin(caller)?;
        self.store.list_namespaces().await
    }

    /// Admin: create a principal.
    pub async fn create_principal(
        &self,
        caller: &CallerContext,
        name: &str,
        kind: PrincipalKind,
        acts_for: &str,
        is_admin: bool,
    ) -> Result<Principal> {
        require_admin(caller)?;
        check_name("principal name", name)?;
        match kind {
            PrincipalKind::Unspecified => {
                return Err(AuthError::Invalid(
                    "kind must be user, agent or service".to_owned(),
                ));
            }
            PrincipalKind::Agent if acts_for.is_empty() => {}
            PrincipalKind::Agent => {
                let user = self.store.get_principal(acts_for).await?.ok_or_else(|| {
                    AuthError::NotFound(format!("principal `{acts_for}` (actsFor)"))
                })?;
                if user.kind() != PrincipalKind::User {
                    return Err(AuthError::Invalid(
                        "actsFor must name a user principal".to_owned(),
                    ));
                }
            }
            _ if !acts_for.is_empty() => {
                return Err(AuthError::Invalid(
                    "only agents act for a user; drop actsFor".to_owned(),
                ));
            }
            _ => {}
        }
        let prefix = match kind {
            PrincipalKind::Agent => "agt",
            PrincipalKind::Service => "svc",
            _ => "usr",
        };
        let principal = Principal {
            id: new_id(prefix),
            name: name.to_owned(),
            kind: kind as i32,
            acts_for: acts_for.to_owned(),
            is_admin,
            created_at_ms: now_ms(),
        };
        self.store.create_principal(&principal).await?;
        Ok(principal)
    }

    /// Admin: every principal.
    pub async fn list_principals(&self, caller: &CallerContext) -> Result<Vec<Principal>> {
        require_admin(caller)?;
        self.store.list_principals().await
    }

    /// Admin: grant (or change) a permission on a namespace, optionally on a folder.
    pub async fn put_grant(
        &self,
        caller: &CallerContext,
        principal_id: &str,
        namespace: &str,
        permission: Permission,
        path_prefix: &str,
    ) -> Result<Grant> {
        require_admin(caller)?;
        validate_namespace(namespace)?;
        if permission == Permission::Unspecified {
            return Err(AuthError::Invalid(
                "permission must be read, write or admin".to_owned(),
            ));
        }
        let grant = Grant {
            id: new_id("grt"),
            principal_id: principal_id.to_owned(),
            namespace: namespace.to_owned(),
            permission: permission as i32,
            path_prefix: normalize_folder_prefix(path_prefix)?,
            created_at_ms: now_ms(),
        };
        self.store.put_grant(&grant).await
    }

    /// Admin: remove a grant.
    pub async fn delete_grant(&self, caller: &CallerContext, grant_id: &str) -> Result<bool> {
        require_admin(caller)?;
        self.store.delete_grant(grant_id).await
    }

    /// Admin: grants, of one principal or all.
    pub async fn list_grants(
        &self,
        caller: &CallerContext,
        principal_id: &str,
    ) -> Result<Vec<Grant>> {
        require_admin(caller)?;
        self.store
            .list_grants(if principal_id.is_empty() {
                None
            } else {
                Some(principal_id)
            })
            .await
    }

    /// Admin: mint a PAT for a principal. The token is returned once.
    pub async fn create_pat(
        &self,
        caller: &CallerContext,
        principal_id: &str,
        name: &str,
        expires_at_ms: Option<i64>,
    ) -> Result<(String, Pat)> {
        require_admin(caller)?;
        self.issue_pat(principal_id, name, expires_at_ms).await
    }

    /// Admin: PATs (never their secrets), of one principal or all.
    pub async fn list_pats(&self, caller: &CallerContext, principal_id: &str) -> Result<Vec<Pat>> {
        require_admin(caller)?;
        self.store
            .list_pats(if principal_id.is_empty() {
                None
            } else {
                Some(principal_id)
            })
            .await
    }

    /// Admin: revoke a PAT; it fails on the very next call.
    pub async fn revoke_pat(&self, caller: &CallerContext, pat_id: &str) -> Result<bool> {
        require_admin(caller)?;
        self.store.revoke_pat(pat_id, now_ms()).await
    }
}
