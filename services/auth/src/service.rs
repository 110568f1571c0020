//! The auth domain: authorize tokens into signed caller contexts, the admin
//! operations on namespaces, principals, groups, grants, denies and PATs, and
//! the audit log.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use kg_common::access::{normalize_folder_prefix, validate_namespace};
use kg_common::caller::{
    CONTEXT_TTL_MS, ContextSigner, PublicKey, minted_for_admin_api, now_ms, require_admin,
    require_admin_api,
};
use kg_proto::v1::{
    AccessFilter, AuditEvent, AuthorizeResponse, CallerContext, Deny, Grant, Group,
    ListAuditRequest, ListAuditResponse, Namespace, Pat, Permission, Principal, PrincipalKind,
    RetireNamespaceResponse,
};
use subtle::ConstantTimeEq as _;

use crate::cache::{AccessCache, Resolved};
use crate::error::{AuthError, Result};
use crate::pat::{self, DeploymentTag, PatHasher};
use crate::resolve::{admin_filters, intersect, resolve};
use crate::store::{AuditQuery, AuthStore, PAT_TOUCH_MS, PatOwner};

/// Longest accepted display name.
const MAX_NAME_LEN: usize = 200;
/// Longest accepted file id in a deny.
const MAX_FILE_ID_LEN: usize = 200;
/// Furthest expiry a PAT may be given: ten years.
const MAX_PAT_LIFETIME_MS: i64 = 3650 * 86_400_000;

/// Audit field limits: an event is metadata, never payload.
const MAX_AUDIT_TOOL_LEN: usize = 128;
const MAX_AUDIT_OUTCOME_LEN: usize = 64;
const MAX_AUDIT_NAMESPACES: usize = kg_proto::limits::AUDIT_NAMESPACES;
const MAX_AUDIT_NAMESPACE_LEN: usize = 128;
const MAX_AUDIT_REQUEST_ID_LEN: usize = 128;
const MAX_AUDIT_TRANSPORT_LEN: usize = 32;
const MAX_AUDIT_TARGET_LEN: usize = kg_proto::limits::AUDIT_TARGET_LEN;
/// Audit page sizes.
const DEFAULT_AUDIT_LIMIT: u32 = 100;
const MAX_AUDIT_LIMIT: u32 = 1000;
/// Audit events one statement of a prune deletes, so none holds the table long while tool
/// calls keep recording.
const AUDIT_PRUNE_BATCH: i64 = 500;

/// Who a grant or deny applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// One principal.
    Principal(String),
    /// Every member of a group.
    Group(String),
    /// Every principal (denies only; as a listing filter: no filter).
    Everyone,
}

impl Subject {
    /// From the wire pair: a principal id, a group id, or everyone when both
    /// are empty. Both set is refused.
    pub fn from_ids(principal_id: &str, group_id: &str) -> Result<Self> {
        match (principal_id.is_empty(), group_id.is_empty()) {
            (true, true) => Ok(Subject::Everyone),
            (false, true) => Ok(Subject::Principal(principal_id.to_owned())),
            (true, false) => Ok(Subject::Group(group_id.to_owned())),
            (false, false) => Err(AuthError::Invalid(
                "set principalId or groupId, not both".to_owned(),
            )),
        }
    }

    /// The non-NULL key of the subject in `kg_denies.subject_key`.
    fn key(&self) -> String {
        match self {
            Subject::Principal(id) => format!("p:{id}"),
            Subject::Group(id) => format!("g:{id}"),
            Subject::Everyone => "*".to_owned(),
        }
    }
}

/// What a deny hides: a folder (and everything under it) or one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DenyTarget {
    /// A folder prefix; normalised to `a/b/` when the deny is stored.
    Folder(String),
    /// One file id.
    File(String),
}

impl DenyTarget {
    /// From the wire pair: exactly one of them must be set.
    pub fn from_fields(path_prefix: &str, file_id: &str) -> Result<Self> {
        match (path_prefix.trim().is_empty(), file_id.is_empty()) {
            (false, true) => Ok(DenyTarget::Folder(path_prefix.to_owned())),
            (true, false) => Ok(DenyTarget::File(file_id.to_owned())),
            _ => Err(AuthError::Invalid(
                "a deny names exactly one of pathPrefix (a folder) and fileId".to_owned(),
            )),
        }
    }
}

/// The auth service's state.
#[derive(Clone)]
pub struct AuthService {
    store: AuthStore,
    /// Authorize's resolutions, valid while the access epoch holds.
    cache: Arc<AccessCache>,
    signer: Arc<ContextSigner>,
    hasher: PatHasher,
    deployment_id: String,
    tag: DeploymentTag,
}

/// Refuses a revoked or expired token, and the token of a disabled principal or of an agent
/// acting for a disabled user (the same error as any bad token; only the log says why).
fn check_usable(owner: &PatOwner, now_ms: i64) -> Result<()> {
    if owner.revoked_at_ms.is_some() || owner.expires_at_ms.is_some_and(|e| e <= now_ms) {
        return Err(AuthError::InvalidToken);
    }
    if owner.principal.disabled_at_ms != 0 || owner.acts_for_disabled_at_ms.is_some() {
        tracing::debug!(principal = %owner.principal.id, "token refused: principal or the user it acts for is disabled");
        return Err(AuthError::InvalidToken);
    }
    Ok(())
}

/// Longest id this service mints, with room to spare (`usr_` and 32 hex digits is 36).
const MAX_ID_LEN: usize = 64;

fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

fn check_name(what: &str, name: &str) -> Result<()> {
    // Counted in characters, as the message says; nothing invisible and no white space at
    // either end, so one name cannot pass for another (`support` and `support `).
    if name.trim().is_empty()
        || name.chars().count() > MAX_NAME_LEN
        || name.trim() != name
        || name
            .chars()
            .any(|c| c.is_control() || kg_common::sanitize::is_hidden_char(c))
    {
        return Err(AuthError::Invalid(format!(
            "{what} must be 1-{MAX_NAME_LEN} characters without white space at either end, \
             control characters or invisible ones (bidi controls, zero-width characters)"
        )));
    }
    Ok(())
}

/// The role every admin holds (see `roles_of`).
const ADMIN_ROLE: &str = "admin";

/// Longest namespace description, in characters.
const MAX_DESCRIPTION_CHARS: usize = 1_000;

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
            cache: Arc::new(AccessCache::default()),
            signer: Arc::new(signer),
            hasher: PatHasher::new(pat_key),
            tag: DeploymentTag::of(&deployment_id),
            deployment_id,
        })
    }

    /// A probe of the auth tables' database, for the health service: auth can authorize
    /// nothing while it is unreachable.
    pub fn store_probe(&self) -> kg_common::grpc::StoreProbe {
        self.store.health_probe()
    }

    /// The verifying key services must trust.
    pub fn public_key(&self) -> PublicKey {
        self.signer.public_key()
    }

    /// The id of this deployment, carried in every context.
    pub fn deployment_id(&self) -> &str {
        &self.deployment_id
    }

    /// Resolves a token into a signed caller context carrying the roles granted to
    /// its principal. Runs on every call: revoking a PAT or a grant takes effect on
    /// the next one.
    pub async fn authorize(
        &self,
        token: &str,
        tool: &str,
        namespaces: &[String],
        request_id: &str,
    ) -> Result<AuthorizeResponse> {
        self.authorize_as(token, tool, namespaces, request_id, None)
            .await
    }

    /// [`Self::authorize`], where `asserted_role` (a stdio launcher's `--role`; `Some("")`
    /// for none) replaces the granted roles in the context: the spec lets whoever
    /// launches a stdio gateway with a token choose its role, and signing it here lets
    /// every service read roles from the context alone.
    pub async fn authorize_as(
        &self,
        token: &str,
        tool: &str,
        namespaces: &[String],
        request_id: &str,
        asserted_role: Option<&str>,
    ) -> Result<AuthorizeResponse> {
        if let Some(role) = asserted_role.filter(|role| !role.is_empty()) {
            kg_common::caller::check_role_name(role)
                .map_err(|problem| AuthError::Invalid(format!("asserted role {problem}")))?;
        }
        let Some(tag) = pat::parse(token) else {
            return Err(AuthError::InvalidToken);
        };
        if tag != self.tag {
            // Same error as any bad token; only the log says why.
            tracing::debug!("token refused: minted by other deployment");
            return Err(AuthError::InvalidToken);
        }
        let hash = self.hasher.hash(token);
        // Read first: whatever is resolved after this read is at least as new as the epoch.
        let epoch = self.store.access_epoch().await?;
        let resolved = match self.cache.get(epoch, &hash) {
            Some(resolved) => resolved,
            None => {
                let owner = self
                    .store
                    .pat_owner(&hash)
                    .await?
                    .ok_or(AuthError::InvalidToken)?;
                if !bool::from(owner.token_hash.as_bytes().ct_eq(hash.as_bytes())) {
                    return Err(AuthError::InvalidToken);
                }
                check_usable(&owner, now_ms())?;
                let (access, roles) = tokio::try_join!(
                    self.access_of(&owner.principal),
                    self.roles_of(&owner.principal)
                )?;
                let resolved = Arc::new(Resolved::new(owner, access, roles));
                self.cache.insert(epoch, hash, Arc::clone(&resolved));
                resolved
            }
        };
        let now = now_ms();
        // Again on a cache hit: a token can expire between two calls.
        check_usable(&resolved.owner, now)?;
        // At most once a minute per token; a failed write loses one "last used" time.
        if resolved.claim_touch(now, PAT_TOUCH_MS)
            && let Err(err) = self.store.touch_pat(&resolved.owner.pat_id, now).await
        {
            tracing::warn!(error = %err, "could not record PAT use");
        }
        let principal = &resolved.owner.principal;
        let access: Vec<AccessFilter> = if namespaces.is_empty() {
            resolved.access.values().cloned().collect()
        } else {
            let mut selected = BTreeMap::new();
            for ns in namespaces {
                let filter = resolved
                    .access
                    .get(ns)
                    .ok_or_else(|| AuthError::NamespaceDenied(ns.clone()))?;
                selected.insert(ns.clone(), filter.clone());
            }
            selected.into_values().collect()
        };
        let context = CallerContext {
            principal_id: principal.id.clone(),
            principal_kind: principal.kind,
            on_behalf_of: principal.acts_for.clone(),
            roles: match asserted_role {
                None => resolved.roles.clone(),
                Some("") => Vec::new(),
                Some(role) => vec![role.to_owned()],
            },
            access,
            issued_at_ms: now,
            expires_at_ms: now + CONTEXT_TTL_MS,
            request_id: request_id.to_owned(),
            tool: tool.to_owned(),
            deployment_id: self.deployment_id.clone(),
            // An agent is never an admin, whatever an older row says (create_principal
            // refuses the flag for agents now).
            is_admin: principal.is_admin && principal.kind() != PrincipalKind::Agent,
            roles_asserted: asserted_role.is_some(),
        };
        Ok(AuthorizeResponse {
            context: Some(self.signer.sign(&context)),
            decoded: Some(context),
        })
    }

    /// Roles for generated ontology tools: `admin` for admins plus the roles
    /// granted through `role:<name>` groups. An agent acting for a user holds
    /// only the roles both have.
    async fn roles_of(&self, principal: &Principal) -> Result<Vec<String>> {
        let mut roles = self.store.roles_of(&principal.id).await?;
        // `admin` is the role of admins alone; a `role:admin` group (refused now, possible in
        // an older store) gives it to no one.
        roles.retain(|r| r != ADMIN_ROLE);
        if principal.kind() == PrincipalKind::Agent && !principal.acts_for.is_empty() {
            let user = self.store.roles_of(&principal.acts_for).await?;
            roles.retain(|r| user.contains(r));
        }
        if principal.is_admin {
            roles.insert(0, ADMIN_ROLE.to_owned());
        }
        Ok(roles)
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
        let (grants, denies) = self.store.access_rows(&principal.id).await?;
        Ok(resolve(&grants, &denies))
    }

    /// Creates the first admin principal and a PAT for it when no admin exists
    /// yet; returns the token (shown once) or `None` when an admin exists.
    pub async fn bootstrap_admin(&self) -> Result<Option<String>> {
        let principal = Principal {
            id: new_id("usr"),
            name: "admin".to_owned(),
            kind: PrincipalKind::User as i32,
            acts_for: String::new(),
            is_admin: true,
            created_at_ms: now_ms(),
            disabled_at_ms: 0,
        };
        if !self.store.create_first_admin(&principal).await? {
            return Ok(None);
        }
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
        if let Some(exp) = expires_at_ms {
            let now = now_ms();
            if exp <= now {
                return Err(AuthError::Invalid(
                    "expiresAtMs must be in the future".to_owned(),
                ));
            }
            // A date no one will see is a typo, not a policy: omit it for no expiry.
            if exp - now > MAX_PAT_LIFETIME_MS {
                return Err(AuthError::Invalid(format!(
                    "expiresAtMs is more than {} days away; omit it for a token that never expires",
                    MAX_PAT_LIFETIME_MS / 86_400_000
                )));
            }
        }
        let (token, prefix) = pat::generate(self.tag);
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
        // Shown in every namespace listing, to people and agents alike.
        if description.chars().count() > MAX_DESCRIPTION_CHARS
            || description
                .chars()
                .any(|c| kg_common::sanitize::is_hidden_char(c) && c != '\n')
        {
            return Err(AuthError::Invalid(format!(
                "description must be at most {MAX_DESCRIPTION_CHARS} characters without \
                 control characters or invisible ones"
            )));
        }
        let ns = Namespace {
            name: name.to_owned(),
            description: description.to_owned(),
            created_at_ms: now_ms(),
        };
        self.store.create_namespace(&ns).await?;
        Ok(ns)
    }

    /// Admin: begins deleting a namespace (see [`AuthStore::retire_namespace`]). The gateway
    /// then has every other service let it go, and ends with [`AuthService::delete_namespace`].
    pub async fn retire_namespace(
        &self,
        caller: &CallerContext,
        name: &str,
    ) -> Result<RetireNamespaceResponse> {
        require_admin(caller)?;
        validate_namespace(name)?;
        let retired = self
            .store
            .retire_namespace(name, now_ms())
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("namespace `{name}`")))?;
        Ok(RetireNamespaceResponse {
            namespace: Some(retired.namespace),
            retired_at_ms: retired.retired_at_ms,
            grants_removed: retired.grants_removed,
            denies_removed: retired.denies_removed,
        })
    }

    /// Admin: forgets a retired namespace and frees its name.
    pub async fn delete_namespace(&self, caller: &CallerContext, name: &str) -> Result<()> {
        require_admin(caller)?;
        validate_namespace(name)?;
        if self.store.delete_namespace(name).await? {
            Ok(())
        } else {
            Err(AuthError::NotFound(format!("namespace `{name}`")))
        }
    }

    /// Every namespace for an admin on the admin API; for any other caller, those it may read.
    pub async fn list_namespaces(&self, caller: &CallerContext) -> Result<Vec<Namespace>> {
        let every = self.store.list_namespaces().await?;
        if caller.is_admin && minted_for_admin_api(caller) {
            return Ok(every);
        }
        // Anyone else sees the namespaces its context grants, as kg_namespaces shows them:
        // a writer can find where to ingest without an admin's help.
        Ok(every
            .into_iter()
            .filter(|namespace| caller.access.iter().any(|a| a.namespace == namespace.name))
            .collect())
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
        if is_admin && kind == PrincipalKind::Agent {
            return Err(AuthError::Invalid(
                "an agent cannot be an admin: administration and approving proposals are for \
                 people; grant the agent what it needs to read instead"
                    .to_owned(),
            ));
        }
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
            disabled_at_ms: 0,
        };
        self.store.create_principal(&principal).await?;
        Ok(principal)
    }

    /// Admin: every principal.
    pub async fn list_principals(&self, caller: &CallerContext) -> Result<Vec<Principal>> {
        require_admin(caller)?;
        self.store.list_principals().await
    }

    /// Admin: disable principal `id` (`disabled`), so that none of its tokens, nor those of
    /// agents acting for it, passes Authorize from the next call on, or enable it again. Its
    /// grants, groups and tokens are kept. An admin cannot disable itself, and the last
    /// enabled admin cannot be disabled.
    pub async fn set_principal_disabled(
        &self,
        caller: &CallerContext,
        id: &str,
        disabled: bool,
    ) -> Result<Principal> {
        require_admin(caller)?;
        // Ids are minted here (`usr_`, `agt_` or `svc_` and 32 hex digits): anything else names
        // none, and is not repeated back at any length.
        if id.is_empty()
            || id.len() > MAX_ID_LEN
            || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(AuthError::Invalid(
                "id must name a principal, as `kgmesh principal list` shows it (usr_..., agt_... \
                 or svc_...)"
                    .to_owned(),
            ));
        }
        if disabled && id == caller.principal_id {
            return Err(AuthError::FailedPrecondition(
                "you cannot disable the principal you are signed in as; another admin can"
                    .to_owned(),
            ));
        }
        self.store
            .set_principal_disabled(id, disabled.then(now_ms))
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("principal `{id}`")))
    }

    /// Admin: grant (or change) a permission on a namespace, optionally on a
    /// folder, to a principal or a group.
    pub async fn put_grant(
        &self,
        caller: &CallerContext,
        subject: &Subject,
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
        let (principal_id, group_id) = match subject {
            Subject::Principal(id) => (id.clone(), String::new()),
            Subject::Group(id) => (String::new(), id.clone()),
            Subject::Everyone => {
                return Err(AuthError::Invalid(
                    "a grant names exactly one of principalId and groupId".to_owned(),
                ));
            }
        };
        let path_prefix = normalize_folder_prefix(path_prefix)?;
        self.require_namespace(namespace).await?;
        self.require_subject(subject).await?;
        let grant = Grant {
            id: new_id("grt"),
            principal_id,
            group_id,
            namespace: namespace.to_owned(),
            permission: permission as i32,
            path_prefix,
            created_at_ms: now_ms(),
        };
        self.store.put_grant(&grant).await
    }

    /// Admin: remove a grant.
    pub async fn delete_grant(&self, caller: &CallerContext, grant_id: &str) -> Result<bool> {
        require_admin(caller)?;
        self.store.delete_grant(grant_id).await
    }

    /// Admin: the direct grants of one principal or one group, or every grant
    /// for [`Subject::Everyone`]. A principal's listing does not include its
    /// groups' grants.
    pub async fn list_grants(
        &self,
        caller: &CallerContext,
        subject: &Subject,
    ) -> Result<Vec<Grant>> {
        require_admin(caller)?;
        self.store.list_grants(subject).await
    }

    async fn require_namespace(&self, namespace: &str) -> Result<()> {
        if self.store.namespace_exists(namespace).await? {
            Ok(())
        } else {
            Err(AuthError::NotFound(format!("namespace `{namespace}`")))
        }
    }

    async fn require_subject(&self, subject: &Subject) -> Result<()> {
        match subject {
            Subject::Principal(id) => {
                self.require_principal(id).await?;
            }
            Subject::Group(id) => {
                if !self.store.group_exists(id).await? {
                    return Err(AuthError::NotFound(format!("group `{id}`")));
                }
            }
            Subject::Everyone => {}
        }
        Ok(())
    }

    async fn require_principal(&self, id: &str) -> Result<Principal> {
        self.store
            .get_principal(id)
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("principal `{id}`")))
    }

    async fn require_group(&self, id: &str) -> Result<Group> {
        self.store
            .get_group(id)
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("group `{id}`")))
    }

    /// Admin: create a group (names are unique).
    pub async fn create_group(&self, caller: &CallerContext, name: &str) -> Result<Group> {
        require_admin(caller)?;
        check_name("group name", name)?;
        if name.strip_prefix(crate::store::ROLE_GROUP_PREFIX) == Some(ADMIN_ROLE) {
            return Err(AuthError::Invalid(format!(
                "group name `{name}`: `{ADMIN_ROLE}` is the role every admin holds and no group \
                 grants; name the role otherwise, or make the principal an admin"
            )));
        }
        let group = Group {
            id: new_id("grp"),
            name: name.to_owned(),
            member_ids: Vec::new(),
            created_at_ms: now_ms(),
        };
        self.store.create_group(&group).await?;
        Ok(group)
    }

    /// Admin: every group with its member ids.
    pub async fn list_groups(&self, caller: &CallerContext) -> Result<Vec<Group>> {
        require_admin(caller)?;
        self.store.list_groups().await
    }

    /// Admin: add a principal to a group (groups do not nest). Adding a member
    /// twice changes nothing. Takes effect on the member's next call.
    pub async fn add_group_member(
        &self,
        caller: &CallerContext,
        group_id: &str,
        principal_id: &str,
    ) -> Result<Group> {
        require_admin(caller)?;
        self.require_group(group_id).await?;
        self.require_principal(principal_id).await?;
        self.store
            .add_group_member(group_id, principal_id, now_ms())
            .await?;
        self.require_group(group_id).await
    }

    /// Admin: remove a principal from a group; removing a non-member changes nothing.
    pub async fn remove_group_member(
        &self,
        caller: &CallerContext,
        group_id: &str,
        principal_id: &str,
    ) -> Result<Group> {
        require_admin(caller)?;
        self.require_group(group_id).await?;
        self.require_principal(principal_id).await?;
        self.store
            .remove_group_member(group_id, principal_id)
            .await?;
        self.require_group(group_id).await
    }

    /// Admin: deny a folder or a file of a namespace to a principal, a group or
    /// everyone. A deny wins over every grant; admins are exempt. Putting the
    /// same deny twice returns the stored one.
    pub async fn put_deny(
        &self,
        caller: &CallerContext,
        namespace: &str,
        subject: &Subject,
        target: &DenyTarget,
    ) -> Result<Deny> {
        require_admin(caller)?;
        validate_namespace(namespace)?;
        let (path_prefix, file_id) = match target {
            DenyTarget::Folder(prefix) => {
                let prefix = normalize_folder_prefix(prefix)?;
                if prefix.is_empty() {
                    return Err(AuthError::Invalid(
                        "a deny needs a folder below the namespace root; to hide a whole namespace remove its grants".to_owned(),
                    ));
                }
                (prefix, String::new())
            }
            DenyTarget::File(id) => {
                if id.is_empty()
                    || id.len() > MAX_FILE_ID_LEN
                    || id.chars().any(|c| c.is_control() || c.is_whitespace())
                {
                    return Err(AuthError::Invalid(format!(
                        "fileId must be 1-{MAX_FILE_ID_LEN} characters without spaces or control characters"
                    )));
                }
                (String::new(), id.clone())
            }
        };
        self.require_namespace(namespace).await?;
        self.require_subject(subject).await?;
        let (principal_id, group_id) = match subject {
            Subject::Principal(id) => (id.clone(), String::new()),
            Subject::Group(id) => (String::new(), id.clone()),
            Subject::Everyone => (String::new(), String::new()),
        };
        let deny = Deny {
            id: new_id("dny"),
            namespace: namespace.to_owned(),
            principal_id,
            group_id,
            path_prefix,
            file_id,
            created_at_ms: now_ms(),
        };
        self.store.put_deny(&deny, &subject.key()).await
    }

    /// Admin: remove a deny.
    pub async fn delete_deny(&self, caller: &CallerContext, deny_id: &str) -> Result<bool> {
        require_admin(caller)?;
        self.store.delete_deny(deny_id).await
    }

    /// Admin: the denies of one namespace, or all of them for "".
    pub async fn list_denies(&self, caller: &CallerContext, namespace: &str) -> Result<Vec<Deny>> {
        require_admin(caller)?;
        if namespace.is_empty() {
            return self.store.list_denies(None).await;
        }
        validate_namespace(namespace)?;
        self.store.list_denies(Some(namespace)).await
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

    /// PATs (never their secrets): an admin's of one principal or all, anyone else's of its
    /// own, so a user can see what holds access in its name without asking an admin.
    pub async fn list_pats(&self, caller: &CallerContext, principal_id: &str) -> Result<Vec<Pat>> {
        require_admin_api(caller)?;
        if caller.is_admin {
            return self
                .store
                .list_pats(Some(principal_id).filter(|id| !id.is_empty()))
                .await;
        }
        if !principal_id.is_empty() && principal_id != caller.principal_id {
            return Err(AuthError::Denied(
                "only an admin lists another principal's PATs; leave the principal out to \
                 list your own"
                    .into(),
            ));
        }
        self.store.list_pats(Some(&caller.principal_id)).await
    }

    /// Admin: give a PAT a new secret, keeping its id, principal, name and
    /// expiry. The old token fails on its next call. Revoked and expired PATs
    /// cannot be rotated.
    pub async fn rotate_pat(&self, caller: &CallerContext, pat_id: &str) -> Result<(String, Pat)> {
        require_admin(caller)?;
        let pat = self
            .store
            .get_pat(pat_id)
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("PAT `{pat_id}`")))?;
        let revoked = || {
            AuthError::FailedPrecondition(format!(
                "PAT `{pat_id}` is revoked; create a new one instead"
            ))
        };
        if pat.revoked_at_ms.is_some() {
            return Err(revoked());
        }
        if pat.expires_at_ms.is_some_and(|e| e <= now_ms()) {
            return Err(AuthError::FailedPrecondition(format!(
                "PAT `{pat_id}` has expired; create a new one instead"
            )));
        }
        let (token, prefix) = pat::generate(self.tag);
        // Conditional on not being revoked, so a concurrent revoke wins.
        if !self
            .store
            .rotate_pat(pat_id, &self.hasher.hash(&token), &prefix)
            .await?
        {
            return Err(revoked());
        }
        Ok((
            token,
            Pat {
                prefix,
                last_used_at_ms: None,
                ..pat
            },
        ))
    }

    /// Revokes a PAT (an admin any, anyone else its own); it fails on the very next call.
    pub async fn revoke_pat(&self, caller: &CallerContext, pat_id: &str) -> Result<bool> {
        require_admin_api(caller)?;
        // Anyone may revoke its own PATs (a token it thinks leaked); another's answers as a
        // missing one, so ids cannot be probed.
        let owner = (!caller.is_admin).then_some(caller.principal_id.as_str());
        self.store.revoke_pat(pat_id, owner, now_ms()).await
    }

    /// Records one tool call of `caller`. Any verified caller may record, but
    /// only for itself: principal and on-behalf-of come from the context, the
    /// id and time from this service; the event's own values for them are
    /// ignored. Only the listed metadata fields are stored, within limits.
    pub async fn record_audit(
        &self,
        caller: &CallerContext,
        event: AuditEvent,
    ) -> Result<AuditEvent> {
        if caller.principal_id.is_empty() {
            return Err(kg_common::caller::CallerError::Missing.into());
        }
        check_audit_text("tool", &event.tool, 1, MAX_AUDIT_TOOL_LEN)?;
        check_audit_text("outcome", &event.outcome, 1, MAX_AUDIT_OUTCOME_LEN)?;
        check_audit_text("requestId", &event.request_id, 0, MAX_AUDIT_REQUEST_ID_LEN)?;
        check_audit_text("transport", &event.transport, 0, MAX_AUDIT_TRANSPORT_LEN)?;
        check_audit_text("target", &event.target, 0, MAX_AUDIT_TARGET_LEN)?;
        if event.namespaces.len() > MAX_AUDIT_NAMESPACES {
            return Err(AuthError::Invalid(format!(
                "at most {MAX_AUDIT_NAMESPACES} namespaces per audit event; count the rest in \
                 moreNamespaces"
            )));
        }
        for ns in &event.namespaces {
            check_audit_text("namespace", ns, 1, MAX_AUDIT_NAMESPACE_LEN)?;
        }
        if event.latency_us < 0 || event.result_bytes < 0 {
            return Err(AuthError::Invalid(
                "latencyUs and resultBytes must not be negative".to_owned(),
            ));
        }
        // When the call happened, as the gateway saw it: an event sent again after an auth
        // restart arrives late. Bounded by the signed context (the call came after auth issued
        // it) and by now, so no gateway can place an event elsewhere in the log.
        let now = now_ms();
        let at_ms = if event.at_ms > 0 {
            event.at_ms.clamp(caller.issued_at_ms.min(now), now)
        } else {
            now
        };
        let stored = AuditEvent {
            id: new_id("aud"),
            at_ms,
            principal_id: caller.principal_id.clone(),
            on_behalf_of: caller.on_behalf_of.clone(),
            tool: event.tool,
            namespaces: event.namespaces,
            outcome: event.outcome,
            latency_us: event.latency_us,
            result_bytes: event.result_bytes,
            request_id: event.request_id,
            transport: event.transport,
            more_namespaces: event.more_namespaces,
            target: event.target,
        };
        self.store.insert_audit(&stored).await?;
        Ok(stored)
    }

    /// Deletes every audit event recorded before `before_ms` (Unix milliseconds), oldest
    /// first, [`AUDIT_PRUNE_BATCH`] a statement; how many. Internal: the audit retention
    /// (`run_audit_retention`) calls it, no RPC does.
    pub async fn prune_audit(&self, before_ms: i64) -> Result<u64> {
        let mut removed = 0;
        loop {
            let deleted = self
                .store
                .delete_audit_before(before_ms, AUDIT_PRUNE_BATCH)
                .await?;
            removed += deleted;
            kg_common::metrics::metrics()
                .audit_events_pruned
                .inc_by(deleted);
            if deleted < AUDIT_PRUNE_BATCH.unsigned_abs() {
                return Ok(removed);
            }
        }
    }

    /// Admin: audit events, newest first. `limit` 0 means 100, at most 1000;
    /// `since_ms` is inclusive, `until_ms` exclusive; `cursor` continues a
    /// previous page (empty `next_cursor` = no more events).
    pub async fn list_audit(
        &self,
        caller: &CallerContext,
        request: &ListAuditRequest,
    ) -> Result<ListAuditResponse> {
        require_admin(caller)?;
        let limit = match request.limit {
            0 => DEFAULT_AUDIT_LIMIT,
            n if n <= MAX_AUDIT_LIMIT => n,
            _ => {
                return Err(AuthError::Invalid(format!(
                    "limit must be 1-{MAX_AUDIT_LIMIT} (0 = {DEFAULT_AUDIT_LIMIT})"
                )));
            }
        };
        if let (Some(since), Some(until)) = (request.since_ms, request.until_ms)
            && since >= until
        {
            return Err(AuthError::Invalid(
                "sinceMs must be before untilMs".to_owned(),
            ));
        }
        let query = AuditQuery {
            principal_id: non_empty(&request.principal_id),
            tool: non_empty(&request.tool),
            since_ms: request.since_ms,
            until_ms: request.until_ms,
            after: if request.cursor.is_empty() {
                None
            } else {
                Some(decode_cursor(&request.cursor)?)
            },
        };
        // One extra row says whether another page exists.
        let mut events = self.store.list_audit(&query, i64::from(limit) + 1).await?;
        let more = events.len() > limit as usize;
        events.truncate(limit as usize);
        let next_cursor = match events.last() {
            Some(last) if more => encode_cursor(last.at_ms, &last.id),
            _ => String::new(),
        };
        Ok(ListAuditResponse {
            events,
            next_cursor,
        })
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

fn check_audit_text(field: &str, value: &str, min: usize, max: usize) -> Result<()> {
    let len = value.chars().count();
    if len < min || len > max || value.chars().any(char::is_control) {
        return Err(AuthError::Invalid(format!(
            "audit {field} must be {min}-{max} characters without control characters"
        )));
    }
    Ok(())
}

/// Opaque keyset cursor: base64url of `<at_ms>:<id>` of the last event returned.
fn encode_cursor(at_ms: i64, id: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{at_ms}:{id}"))
}

fn decode_cursor(cursor: &str) -> Result<(i64, String)> {
    let bad = || AuthError::Invalid("cursor is not one this service returned".to_owned());
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (at, id) = text.split_once(':').ok_or_else(bad)?;
    let at: i64 = at.parse().map_err(|_| bad())?;
    if id.is_empty() || id.len() > 64 {
        return Err(bad());
    }
    Ok((at, id.to_owned()))
}
