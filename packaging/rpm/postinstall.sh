# nodekeeper %post (see packaging/deb/postinst: same behaviour).
mkdir -p /etc/nodekeeper /var/lib/nodekeeper
chmod 0750 /var/lib/nodekeeper
if command -v systemctl >/dev/null 2>&1; then
    systemctl daemon-reload >/dev/null 2>&1 || :
    systemctl enable nodekeeper-crio-apply.service >/dev/null 2>&1 || :
    if [ -f /etc/nodekeeper/agent.toml ]; then
        systemctl enable nodekeeper-agent.service >/dev/null 2>&1 || :
    fi
fi
