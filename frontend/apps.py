from django.apps import AppConfig


class FrontendConfig(AppConfig):
    name = "respawn_server.frontend"
    label = "frontend"
