# The stack's packages, sourced by ci/_common.sh (ci/test, ci/demo) and ci/gpu. Needs ROOT set.
# Dependency order: deepinfer (and smallpond's threefs extra) need their siblings installed first.
ALL_PACKAGES=(eplb flashmla deepgemm deepep dualpipe threefs smallpond deepinfer)

# packages that exist (a folder with a pyproject.toml), optionally filtered by the arguments
existing_packages() {
  local want=("$@") p
  for p in "${ALL_PACKAGES[@]}"; do
    [ -f "$ROOT/$p/pyproject.toml" ] || continue
    if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " =~ " $p " ]]; then continue; fi
    echo "$p"
  done
}
