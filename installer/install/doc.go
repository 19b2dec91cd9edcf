// Package install puts galactic on a node and takes it off again.
//
// Install copies the plugin binaries into the CNI bin dir, writes the node
// settings file every galactic binary reads, a kubeconfig for the plugins,
// galactic-router's config when it is given router inputs (a mounted file,
// flags over its keys, checked with the router's own validation) and
// creates the state dir. Every file is written atomically (a temporary
// file in the target directory, then a rename), so a runtime that executes a
// plugin while it is being replaced runs the old or the new binary, never a
// torn one. A file whose content and mode already match is left alone, so a
// second install with the same inputs changes nothing and says so.
//
// Install keeps a record of the files it wrote and the directories it
// created (installed.json in the state dir, as host paths without the root);
// Uninstall drains the router when its config is there, then removes
// exactly those and nothing else, also when it runs with the host mounted
// under another root. Run keeps the kubeconfig's service account token fresh
// while the kubelet rotates the projected token.
//
// Every host path is joined under Options.Root. In a DaemonSet the host
// directories are mounted at their own paths and Root is empty; tests and
// the demo install into a temporary root and use the files where they are,
// so the paths written into node.json and the kubeconfig include the root.
package install
