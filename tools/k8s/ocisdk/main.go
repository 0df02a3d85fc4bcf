// Command ocisdk builds and signs OCI API requests with the OCI Go SDK's own service clients, for
// nodekeeper's cross-check (tests/host/oci_sdk_crosscheck.rs): the SDK's request for each case of
// a JSON file, captured instead of sent (a dispatcher stands in for the network and answers 2xx),
// printed as one JSON line per case. nodekeeper's signed requests for the same inputs must equal
// these byte for byte.
//
//	ocisdk CASES.json
//	ocisdk workload-identity HOST INSTANCE CA_FILE
//	ocisdk instance-principal HOST INSTANCE CA_FILE
//
// CASES.json: {"tenancy", "user", "fingerprint", "key_file", "cases": [{"op", "host", "date",
// "request_id", "instance", "node_pool", "work_request", "eviction_grace", "force"}]}; op is
// TerminateInstance, GetInstance, DeleteNode or GetWorkRequest; host is `https://host:port`.
//
// workload-identity: the SDK's own OKE workload identity provider
// (auth.OkeWorkloadIdentityConfigurationProviderWithServiceAccountTokenProvider, configured by the
// environment as in a pod: KUBERNETES_SERVICE_HOST, OCI_KUBERNETES_SERVICE_ACCOUNT_CERT_PATH,
// OCI_RESOURCE_PRINCIPAL_VERSION=2.2, OCI_RESOURCE_PRINCIPAL_REGION; the service account token in
// NK_SA_TOKEN) gets a session from the token endpoint at $KUBERNETES_SERVICE_HOST:12250, then calls
// GetInstance(INSTANCE) on HOST (trusting CA_FILE) with it: success proves the endpoint works for
// the SDK. Prints the instance's lifecycleState and the session keyId's prefix.
//
// instance-principal: the same with the SDK's auth.InstancePrincipalConfigurationProvider, pointed
// by the environment at the stand-in's metadata service (OCI_METADATA_BASE_URL) and auth service
// (OCI_SDK_AUTH_CLIENT_REGION_URL), trusting SSL_CERT_FILE.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/oracle/oci-go-sdk/v65/common"
	"github.com/oracle/oci-go-sdk/v65/common/auth"
	"github.com/oracle/oci-go-sdk/v65/containerengine"
	"github.com/oracle/oci-go-sdk/v65/core"
)

type input struct {
	Tenancy     string     `json:"tenancy"`
	User        string     `json:"user"`
	Fingerprint string     `json:"fingerprint"`
	KeyFile     string     `json:"key_file"`
	Cases       []caseSpec `json:"cases"`
}

type caseSpec struct {
	Op            string `json:"op"`
	Host          string `json:"host"`
	Date          string `json:"date"`
	RequestID     string `json:"request_id"`
	Instance      string `json:"instance"`
	NodePool      string `json:"node_pool"`
	WorkRequest   string `json:"work_request"`
	EvictionGrace string `json:"eviction_grace"`
	Force         bool   `json:"force"`
}

type captured struct {
	Op            string `json:"op"`
	Method        string `json:"method"`
	Target        string `json:"target"`
	Host          string `json:"host"`
	Date          string `json:"date"`
	Authorization string `json:"authorization"`
	RequestID     string `json:"opc_request_id"`
}

// capture stands in for the network: it keeps the request and answers with status and body.
type capture struct {
	req    *http.Request
	status int
	body   string
}

func (c *capture) Do(r *http.Request) (*http.Response, error) {
	c.req = r
	return &http.Response{
		StatusCode: c.status,
		Header:     http.Header{"Content-Type": []string{"application/json"}},
		Body:       io.NopCloser(bytes.NewBufferString(c.body)),
		Request:    r,
	}, nil
}

func run(in input, c caseSpec) (captured, error) {
	key, err := os.ReadFile(in.KeyFile)
	if err != nil {
		return captured{}, err
	}
	provider := common.NewRawConfigurationProvider(in.Tenancy, in.User, "us-phoenix-1", in.Fingerprint, string(key), nil)
	pinDate := func(r *http.Request) error {
		r.Header.Set("Date", c.Date)
		return nil
	}
	// No retries, no circuit breaker: one request per case.
	noRetry := common.NoRetryPolicy()
	ctx := context.Background()
	var cap *capture
	switch c.Op {
	case "TerminateInstance", "GetInstance":
		client, err := core.NewComputeClientWithConfigurationProvider(provider)
		if err != nil {
			return captured{}, err
		}
		client.Host = c.Host
		client.Interceptor = pinDate
		client.Configuration.CircuitBreaker = nil
		if c.Op == "TerminateInstance" {
			cap = &capture{status: 204}
			client.HTTPClient = cap
			preserve := false
			_, err = client.TerminateInstance(ctx, core.TerminateInstanceRequest{
				InstanceId: &c.Instance, PreserveBootVolume: &preserve, OpcRequestId: &c.RequestID,
				RequestMetadata: common.RequestMetadata{RetryPolicy: &noRetry}})
		} else {
			cap = &capture{status: 200, body: `{"lifecycleState": "TERMINATING"}`}
			client.HTTPClient = cap
			_, err = client.GetInstance(ctx, core.GetInstanceRequest{
				InstanceId: &c.Instance, OpcRequestId: &c.RequestID,
				RequestMetadata: common.RequestMetadata{RetryPolicy: &noRetry}})
		}
		if err != nil {
			return captured{}, err
		}
	case "DeleteNode", "GetWorkRequest":
		client, err := containerengine.NewContainerEngineClientWithConfigurationProvider(provider)
		if err != nil {
			return captured{}, err
		}
		client.Host = c.Host
		client.Interceptor = pinDate
		client.Configuration.CircuitBreaker = nil
		if c.Op == "DeleteNode" {
			cap = &capture{status: 202}
			client.HTTPClient = cap
			decrement := false
			_, err = client.DeleteNode(ctx, containerengine.DeleteNodeRequest{
				NodePoolId: &c.NodePool, NodeId: &c.Instance, IsDecrementSize: &decrement,
				OverrideEvictionGraceDuration: &c.EvictionGrace, IsForceDeletionAfterOverrideGraceDuration: &c.Force,
				OpcRequestId: &c.RequestID, RequestMetadata: common.RequestMetadata{RetryPolicy: &noRetry}})
		} else {
			cap = &capture{status: 200, body: `{"status": "SUCCEEDED"}`}
			client.HTTPClient = cap
			_, err = client.GetWorkRequest(ctx, containerengine.GetWorkRequestRequest{
				WorkRequestId: &c.WorkRequest, OpcRequestId: &c.RequestID,
				RequestMetadata: common.RequestMetadata{RetryPolicy: &noRetry}})
		}
		if err != nil {
			return captured{}, err
		}
	default:
		return captured{}, fmt.Errorf("unknown op %q", c.Op)
	}
	r := cap.req
	return captured{
		Op: c.Op, Method: r.Method, Target: r.URL.RequestURI(), Host: r.URL.Host,
		Date: r.Header.Get("Date"), Authorization: r.Header.Get("Authorization"),
		RequestID: r.Header.Get("Opc-Request-Id"),
	}, nil
}

func sessionCall(mode, host, instance, caFile string) error {
	var provider common.ConfigurationProvider
	var err error
	if mode == "workload-identity" {
		provider, err = auth.OkeWorkloadIdentityConfigurationProviderWithServiceAccountTokenProvider(
			auth.NewSuppliedServiceAccountTokenProvider(os.Getenv("NK_SA_TOKEN")))
	} else {
		provider, err = auth.InstancePrincipalConfigurationProvider()
	}
	if err != nil {
		return fmt.Errorf("%s provider: %w", mode, err)
	}
	keyID, err := provider.KeyID()
	if err != nil {
		return fmt.Errorf("session: %w", err)
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	client, err := core.NewComputeClientWithConfigurationProvider(provider)
	if err != nil {
		return err
	}
	client.Host = host
	client.Configuration.CircuitBreaker = nil
	client.HTTPClient = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	noRetry := common.NoRetryPolicy()
	resp, err := client.GetInstance(context.Background(), core.GetInstanceRequest{
		InstanceId: &instance, RequestMetadata: common.RequestMetadata{RetryPolicy: &noRetry}})
	if err != nil {
		return fmt.Errorf("GetInstance with the session: %w", err)
	}
	prefix := keyID
	if len(prefix) > 3 {
		prefix = prefix[:3]
	}
	fmt.Printf("%s %s\n", resp.Instance.LifecycleState, prefix)
	return nil
}

func main() {
	if len(os.Args) == 5 && (os.Args[1] == "workload-identity" || os.Args[1] == "instance-principal") {
		if err := sessionCall(os.Args[1], os.Args[2], os.Args[3], os.Args[4]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: ocisdk CASES.json")
		os.Exit(2)
	}
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var in input
	if err := json.Unmarshal(raw, &in); err != nil {
		fmt.Fprintln(os.Stderr, "cases:", err)
		os.Exit(1)
	}
	out := json.NewEncoder(os.Stdout)
	for _, c := range in.Cases {
		got, err := run(in, c)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", c.Op, err)
			os.Exit(1)
		}
		if err := out.Encode(got); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
