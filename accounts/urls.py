from django.contrib.auth import views as auth_views
from django.urls import path

from accounts import passkey_views, sso_views, views
from accounts.metering import metered

app_name = "accounts"

urlpatterns = [
    path("signup/", views.signup, name="signup"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", metered("request")(auth_views.LogoutView.as_view()), name="logout"),
    path("keys/", views.api_keys, name="api_keys"),
    path("keys/<int:api_key_id>/revoke/", views.api_key_revoke_view, name="api_key_revoke"),
    path("settings/", views.settings_view, name="settings"),
    path("sessions/end-others/", views.sessions_end_others_view, name="sessions_end_others"),
    path("export/", views.account_export_view, name="export"),
    path("password/reset/", views.PasswordResetView.as_view(), name="password_reset"),
    path("password/reset/sent/", views.PasswordResetDoneView.as_view(), name="password_reset_done"),
    path("password/reset/<uidb64>/<token>/", views.PasswordResetConfirmView.as_view(), name="password_reset_confirm"),
    path("password/reset/done/", views.PasswordResetCompleteView.as_view(), name="password_reset_complete"),
    path("password/change/", views.PasswordChangeView.as_view(), name="password_change"),
    path("email/verify/<str:token>/", views.email_verify_view, name="email_verify"),
    path("email/resend/", views.email_verification_resend_view, name="email_resend"),
    path("two-factor/", views.two_factor_view, name="two_factor"),
    path("two-factor/setup/", views.two_factor_setup_view, name="two_factor_setup"),
    path("two-factor/disable/", views.two_factor_disable_view, name="two_factor_disable"),
    path("delete/", views.account_delete_view, name="delete"),
    path("sso/<slug:slug>/start/", sso_views.sso_start_view, name="sso_start"),
    path("sso/<slug:slug>/callback/", sso_views.sso_callback_view, name="sso_callback"),
    path("sso/linked/<int:identity_id>/remove/", sso_views.linked_identity_remove_view, name="linked_identity_remove"),
    path("passkeys/options/", passkey_views.passkey_register_options_view, name="passkey_register_options"),
    path("passkeys/", passkey_views.passkey_register_view, name="passkey_register"),
    path("passkeys/<int:passkey_id>/remove/", passkey_views.passkey_remove_view, name="passkey_remove"),
    path(
        "two-factor/passkey/options/",
        passkey_views.passkey_second_factor_options_view,
        name="passkey_second_factor_options",
    ),
    path("two-factor/passkey/", passkey_views.passkey_second_factor_view, name="passkey_second_factor"),
    path("login/passkey/options/", passkey_views.passkey_sign_in_options_view, name="passkey_sign_in_options"),
    path("login/passkey/", passkey_views.passkey_sign_in_view, name="passkey_sign_in"),
]
