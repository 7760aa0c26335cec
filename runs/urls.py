from django.urls import path

from runs import views

urlpatterns = [path("", views.index, name="index")]
