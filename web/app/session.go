package app

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/internal/throttle"
)

const (
	sessionCookie = "cp_session"
	loginCookie   = "cp_login" // binds the sign-in form's CSRF token before there is a session
)

// session is the signed content of the session cookie.
type session struct {
	OwnerID int64  `json:"o"`
	Owner   string `json:"n"`
	Expires int64  `json:"e"` // unix seconds
	Nonce   string `json:"k"` // random per sign-in; CSRF tokens derive from it
	// Gen is the owner's session generation at sign-in: signing out moves
	// it on (Backend.EndSessions), which ends this session everywhere.
	Gen int64 `json:"g"`
}

func (h *handler) mac(parts ...string) []byte {
	m := hmac.New(sha256.New, h.opt.Key)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

func nonce() string {
	b := make([]byte, 18)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// sign encodes v as payload.mac.
func (h *handler) sign(purpose string, v any) string {
	b, _ := json.Marshal(v)
	p := base64.RawURLEncoding.EncodeToString(b)
	return p + "." + base64.RawURLEncoding.EncodeToString(h.mac(purpose, p))
}

// verify decodes a value sign made, or fails.
func (h *handler) verify(purpose, s string, v any) bool {
	p, m, ok := strings.Cut(s, ".")
	if !ok {
		return false
	}
	got, err := base64.RawURLEncoding.DecodeString(m)
	if err != nil || !hmac.Equal(got, h.mac(purpose, p)) {
		return false
	}
	b, err := base64.RawURLEncoding.DecodeString(p)
	return err == nil && json.Unmarshal(b, v) == nil
}

// session returns the request's valid session.
func (h *handler) session(r *http.Request) (session, bool) {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return session{}, false
	}
	var s session
	if !h.verify("session", c.Value, &s) || time.Now().Unix() > s.Expires || s.Nonce == "" {
		return session{}, false
	}
	// A signed cookie outlives its sign-out: the owner's generation,
	// shared by the replicas, says whether it still holds.
	gen, err := h.b.SessionGeneration(r.Context(), s.OwnerID)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			h.log.Warn("dashboard session check", "err", err)
		}
		return session{}, false
	}
	if gen != s.Gen {
		return session{}, false
	}
	return s, true
}

// csrf is the form token of a session.
func (h *handler) csrf(s session) string {
	return base64.RawURLEncoding.EncodeToString(h.mac("csrf", s.Nonce))
}

func (h *handler) csrfOK(s session, token string) bool {
	got, err := base64.RawURLEncoding.DecodeString(token)
	return err == nil && token != "" && hmac.Equal(got, h.mac("csrf", s.Nonce))
}

// setCookie sets an HTTP-only, SameSite=Strict cookie on /app/, Secure
// whenever the browser will send a Secure cookie back (secureRequest).
func setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: "/app/", MaxAge: maxAge,
		HttpOnly: true, Secure: secureRequest(r), SameSite: http.SameSiteStrictMode})
}

// secureRequest tells whether a Secure cookie set in answer to r comes
// back: when r came over TLS, here or (X-Forwarded-Proto: https) at a
// proxy in front, or when it was made to the machine itself (localhost,
// 127.0.0.0/8, [::1]), which browsers treat as secure even over plain
// HTTP. Over plain HTTP to any other host a browser drops a Secure cookie
// without a word, and signing in would silently fail.
func secureRequest(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	proto, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ",")
	if strings.EqualFold(strings.TrimSpace(proto), "https") {
		return true
	}
	return loopbackHost(r.Host)
}

// loopbackHost tells whether a Host header names the machine itself.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// safeNext keeps a redirect after sign-in on the dashboard.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/app/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/app/"
	}
	return next
}

func (h *handler) loginPage(w http.ResponseWriter, r *http.Request) {
	if _, ok := h.session(r); ok {
		http.Redirect(w, r, safeNext(r.URL.Query().Get("next")), http.StatusSeeOther)
		return
	}
	h.renderLogin(w, r, http.StatusOK, "")
}

func (h *handler) renderLogin(w http.ResponseWriter, r *http.Request, status int, msg string) {
	n := nonce()
	setCookie(w, r, loginCookie, n, 3600)
	w.Header().Set("Cache-Control", "no-store")
	p := &pageCtx{w: w, r: r}
	h.render(p, status, LoginPage(LoginData{CSS: h.assets.URL("app.css"), JS: h.assets.URL("app.js"),
		CSRF: base64.RawURLEncoding.EncodeToString(h.mac("login", n)), Next: safeNext(r.FormValue("next")), Error: msg,
		Insecure: !secureRequest(r), Host: r.Host}))
}

func (h *handler) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	c, err := r.Cookie(loginCookie)
	got, _ := base64.RawURLEncoding.DecodeString(r.PostFormValue("csrf"))
	if err != nil || c.Value == "" || !hmac.Equal(got, h.mac("login", c.Value)) {
		h.renderLogin(w, r, http.StatusForbidden, "The sign-in form expired or did not come from this site. Please try again.")
		return
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	// Sign-ins in flight count against the address's failures until they
	// end (throttle.Failures.Begin): tokens sent at once are not all
	// looked up.
	wait, done, err := h.failures.Begin(r.Context(), clientAddr(r))
	if err != nil {
		return // the client is gone
	}
	if wait > 0 {
		h.log.Info("dashboard sign-in throttled", "remote", r.RemoteAddr)
		w.Header().Set("Retry-After", throttle.RetryAfter(wait))
		h.renderLogin(w, r, http.StatusTooManyRequests, "Too many sign-in attempts from this address. Please wait a minute and try again.")
		return
	}
	defer done(false) // done at once below, unless the lookup panics
	if token == "" {
		done(false)
		h.renderLogin(w, r, http.StatusUnauthorized, "Enter your owner token (cyclepool token create NAME prints one).")
		return
	}
	o, err := h.b.OwnerByToken(r.Context(), token)
	done(errors.Is(err, store.ErrNotFound))
	if errors.Is(err, store.ErrNotFound) {
		h.log.Info("dashboard sign-in refused", "remote", r.RemoteAddr)
		h.renderLogin(w, r, http.StatusUnauthorized, "That token is not known here.")
		return
	}
	var gen int64
	if err == nil {
		gen, err = h.b.SessionGeneration(r.Context(), o.ID)
	}
	if err != nil {
		h.log.Error("dashboard sign-in", "err", err)
		h.renderLogin(w, r, http.StatusInternalServerError, "The server could not check the token just now. Please try again.")
		return
	}
	s := session{OwnerID: o.ID, Owner: o.Name, Expires: time.Now().Add(h.opt.SessionTTL).Unix(), Nonce: nonce(), Gen: gen}
	setCookie(w, r, sessionCookie, h.sign("session", s), int(h.opt.SessionTTL/time.Second))
	setCookie(w, r, loginCookie, "", -1)
	http.Redirect(w, r, safeNext(r.PostFormValue("next")), http.StatusSeeOther)
}

// logout ends the owner's sessions everywhere (a copied cookie, another
// browser), not only this browser's cookie.
func (h *handler) logout(p *pageCtx) {
	if err := h.b.EndSessions(p.r.Context(), p.owner.ID); err != nil {
		h.serverError(p, "sign out", err)
		return
	}
	setCookie(p.w, p.r, sessionCookie, "", -1)
	http.Redirect(p.w, p.r, "/app/login", http.StatusSeeOther)
}

// clientAddr is the address a request came from, for the sign-in
// throttle (the connection's: a header a client sets is not trusted).
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
