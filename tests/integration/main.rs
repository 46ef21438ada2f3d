mod api_objects;
mod imagepulljob;
mod manager;
mod smoke;
mod support;
