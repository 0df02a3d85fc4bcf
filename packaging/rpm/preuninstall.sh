# nodekeeper %preun: on erase ($1 = 0), stop and disable both units (not on upgrade).
if [ "$1" -eq 0 ] && command -v systemctl >/dev/null 2>&1; then
    systemctl stop nodekeeper-agent.service >/dev/null 2>&1 || :
    systemctl disable nodekeeper-agent.service nodekeeper-crio-apply.service >/dev/null 2>&1 || :
fi
