// Package plugin is the process boundary between the voxmux router and its inference instances:
// the go-plugin handshake, the gRPC contract (proto/) and the adapters that keep proto types on
// this side of it.
package plugin

import goplugin "github.com/hashicorp/go-plugin"

// ProtocolVersion changes whenever the router and instance protocol stop being compatible.
const ProtocolVersion = 1

// Name is the one plugin an instance process serves.
const Name = "instance"

// Handshake keeps an instance from being started by anything but a voxmux router (and from
// serving a router of another protocol version).
var Handshake = goplugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "VOXMUX_PLUGIN",
	MagicCookieValue: "d6b1c7c4-voxmux-instance",
}

// IsLaunchedByRouter reports whether the process was started by a router (the cookie is set).
func IsLaunchedByRouter(getenv func(string) string) bool {
	return getenv(Handshake.MagicCookieKey) == Handshake.MagicCookieValue
}
