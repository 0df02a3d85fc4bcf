//go:build tools

// Package tools pins Amazon's EC2 metadata mock (AEMM), the real peer of the agent's AWS source;
// scripts/setup-k8s.sh builds its main package github.com/aws/amazon-ec2-metadata-mock/cmd/ec2-metadata-mock.
package tools

import _ "github.com/aws/amazon-ec2-metadata-mock/cmd/ec2-metadata-mock"
